"""One step's experience: sample groups, score them, filter them, compute advantages.

    prompts -> sample k per prompt -> rewards (+ soft overlong penalty) -> GFPO keep G of k
            -> dynamic sampling (drop tied groups, draw again) -> ref / old log-probs
            -> KL in reward -> advantages (outcome + process) -> loss mask (overlong, top-rho)

Every decision is a pure function of grpo.algorithms.advantages / grpo.algorithms.shaping / grpo.algorithms.loss chosen by a config
string; this module only wires them together.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo.algorithms.advantages import REWARD_COMBINERS, Advantages, estimate_advantages
from grpo.config import Config
from grpo.data.prompts import PromptStream, tokenize_prompts
from grpo.modeling.logprobs import fixed_logprobs
from grpo.modeling.precision import rollout_autocast
from grpo.algorithms.loss import KL_ESTIMATORS, logprob_gap
from grpo.algorithms.stabilisers import domain_betas
from grpo.rewards import score
from grpo.rewards.process import score_steps
from grpo.rewards.text import chat_completions
from grpo.envs.episodes import play_episodes, turn_ids
from grpo.rollout import Generation, completion_text, eos_token_ids
from grpo.rollout.engines.native import NativeEngine
from grpo.rollout.params import Prompts, rollout_params
from grpo.rollout.batching import concat_generations, select_rows
from grpo.algorithms.shaping import (gfpo_select, informative_groups, kl_in_reward, overlong_keep, process_advantages,
                          soft_overlong_penalty, token_step_ids, top_entropy_mask)
from grpo.types import Experience, Groups, HostView, PromptBatch, Scored, StepSummary, TrainBatch  # noqa: F401
from grpo.training.cpu_runtime import micro_batch_tokens
from grpo.training.variants import advantage_variants, reward_variants


def select_groups(groups: Groups, index: torch.Tensor) -> Groups:
    """The rows `index` (LongTensor [M]) of `groups`, in that order."""
    idx = index.tolist()
    return Groups(select_rows(groups.gen, index), [groups.prompts[i] for i in idx],
                  {k: [v[i] for i in idx] for k, v in groups.columns.items()},
                  [groups.completions[i] for i in idx], groups.per_function[index], groups.total[index],
                  groups.sample_s, groups.errors, groups.metrics)


def decode_completions(tokenizer, gen: Generation) -> list[str]:
    """Completion texts as TRL gives them to reward functions: the masked ids (no padding) decoded with
    special tokens skipped, so the closing EOS / end-of-turn token and any other special token are not in the
    text (grpo.rollout.eos.completion_text)."""
    return [completion_text(tokenizer, [t for t, m in zip(ids, mask) if m])
            for ids, mask in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist())]


def completion_id_lists(gen: Generation) -> list[list[int]]:
    """Each completion's token ids without padding (EOS kept), as TRL passes ``completion_ids``."""
    return [[t for t, m in zip(ids, mask) if m]
            for ids, mask in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist())]


def reward_columns(columns: dict[str, list], gen: Generation) -> dict[str, list]:
    """The keyword columns of a reward call: the dataset columns plus ``completion_ids`` (a dataset column of
    that name would be replaced without a word: a RewardError naming it)."""
    if "completion_ids" in columns:
        from grpo.rewards import RewardError

        raise RewardError("a column is named 'completion_ids', like the token ids the trainer passes to reward "
                          "functions: rename it (data.column_map)")
    return {**columns, "completion_ids": completion_id_lists(gen)}


def repeat_each(values: list, times: int) -> list:
    """[a, b] -> [a, a, b, b] for times = 2: per-prompt values to per-completion values."""
    return [v for v in values for _ in range(times)]


def lengths_of(gen: Generation) -> torch.Tensor:
    """Completion lengths in tokens (EOS included).  Shape: [N] float32."""
    return gen.completion_mask.sum(dim=1).float()


@dataclass(frozen=True)
class ExperienceInputs:
    """What a step's experience is drawn and scored with, besides the config and the prompts (None: the run has none).

    model, tokenizer: the policy being trained.
    rewards:          [(name, fn)] reward functions, called as TRL calls them (grpo/rewards).
    step_rewards:     process reward functions, scored per reasoning step (grpo/rewards/process.py).
    reference:        the frozen reference policy of the KL term (grpo.modeling.reference).
    env:              grpo.envs.EnvFactory (`rollout.env`): multi-turn episodes instead of single completions.
    critic:           grpo.training.critic.PromptCritic (Hybrid GRPO): its estimator replaces
                      algorithm.advantage.
    engine:           the rollout engine (grpo/rollout/engine.py); None: the native sampler on `model`.
    """

    model: torch.nn.Module
    tokenizer: Any
    rewards: list
    step_rewards: list = field(default_factory=list)
    reference: Any = None
    env: Any = None
    critic: Any = None
    engine: Any = None


def _rollout(inputs: ExperienceInputs, rows: list[dict], prompts: PromptBatch, index: torch.Tensor, cfg: Config,
             k: int) -> tuple[Generation, object]:
    """k completions of each prompt row through the engine (multi-turn episodes with `env`): (Generation,
    episodes or None). `index`: [B] the rows' global positions, the keys of their sampling."""
    model, tokenizer = inputs.model, inputs.tokenizer
    engine = inputs.engine or NativeEngine(model, tokenizer.pad_token_id)
    params = rollout_params(cfg.rollout, eos_token_ids(tokenizer, model), cfg.train.seed, n=k)  # tokenizer's + generation_config's EOS
    if inputs.env is not None:
        episodes = play_episodes(engine, tokenizer, rows, Prompts(prompts.prompt_ids, prompts.prompt_mask, index),
                                 inputs.env, params, cfg.rollout)
        return episodes.gen, episodes                                                       # [B*k, T]
    return engine.generate(prompts.prompt_ids, prompts.prompt_mask, params, prompt_index=index,
                           model_inputs=prompts.model_inputs), None                         # [B*k, T]


def draw_groups(inputs: ExperienceInputs, rows: list[dict], index: list[int], cfg: Config, device) -> Groups:
    """Sample k completions for each prompt row and score them (k = algorithm.gfpo_filter.sample_size or G).

    `index`: each row's global position in the prompt order; with `train.seed` it keys the row's sampling
    (grpo/rollout/keyed.py), so a prompt gets the same k completions on any rank and in any batch.
    `env` (grpo.envs.EnvFactory, `rollout.env`): k multi-turn episodes per row instead; reward functions
    then receive each episode's message list (assistant and tool turns) as its completion. `engine`
    (grpo/rollout/engine.py) generates; None: the native sampler on `model` (:class:`ExperienceInputs`)."""
    ro, algo = cfg.rollout, cfg.algorithm
    gfpo = algo.gfpo_filter                                                                  # {name: metric, sample_size}
    k = gfpo.params.sample_size or ro.num_generations
    model, tokenizer, rewards = inputs.model, inputs.tokenizer, inputs.rewards
    prompts = tokenize_prompts(tokenizer, rows, device)                                     # [B, P]
    t0 = time.perf_counter()
    keyed = torch.tensor(index, dtype=torch.long, device=device)                            # [B]
    with rollout_autocast(device, ro.precision, cfg.train.precision):                       # rollout.precision
        gen, episodes = _rollout(inputs, rows, prompts, keyed, cfg, k)
    sample_s = time.perf_counter() - t0
    completions = decode_completions(tokenizer, gen)
    per_prompt = repeat_each(prompts.prompts, k)
    columns = {name: repeat_each(values, k) for name, values in prompts.columns.items()}
    # as TRL: by keyword, chat prompts get [{"role": "assistant", "content": text}] completions
    scored_completions = chat_completions(per_prompt, completions)
    if episodes is not None:                             # multi-turn: the episode's messages
        scored_completions = episodes.messages
        columns.update(episodes.columns)
    combine = functools.partial(REWARD_COMBINERS[algo.reward_combination], group_size=k, eps=algo.advantage.params.eps)
    scored = score(rewards, cfg.reward.weights, per_prompt, scored_completions,
                   reward_columns(columns, gen), on_error=cfg.reward.reward_errors, timeout_s=cfg.reward.timeout_s,
                   combine=combine)                                                  # the one reward total
    gen, completions, scored, shaped = reward_variants(model, tokenizer, gen, completions, per_prompt, columns, scored,
                                                       rewards, cfg, k, combine)     # EDGE-GRPO GEC, GRPO-LEAD
    total = scored.total
    if algo.overlong_cache_fraction > 0:   # DAPO soft overlong punishment, added to the reward
        cache = max(1, round(algo.overlong_cache_fraction * ro.max_new_tokens))
        lengths = lengths_of(gen).to(total.device)                                       # [k*B] beside the rewards
        total = total + soft_overlong_penalty(lengths, ro.max_new_tokens, cache, algo.overlong_penalty_factor)
    groups = Groups(gen, per_prompt, columns, completions, scored.per_function, total, sample_s, scored.errors,
                    {**(episodes.metrics if episodes is not None else {}), **shaped})
    if gfpo.params.sample_size:              # GFPO: keep G of the k samples of each prompt
        lengths = lengths_of(gen).to(total.device)
        groups = select_groups(groups, gfpo_select(total, lengths, k, ro.num_generations, gfpo.name))
    return groups


def group_rows(group_ids: list[int], G: int) -> torch.Tensor:
    """Row indices of whole groups.  [2, 0] with G = 2 -> [4, 5, 0, 1]."""
    return torch.tensor([g * G + j for g in group_ids for j in range(G)], dtype=torch.long, device="cpu")


def concat_groups(parts: list[Groups], pad_token_id: int) -> Groups:
    return Groups(concat_generations([p.gen for p in parts], pad_token_id),
                  [x for p in parts for x in p.prompts],
                  {k: [x for p in parts for x in p.columns[k]] for k in parts[0].columns},
                  [x for p in parts for x in p.completions],
                  torch.cat([p.per_function for p in parts]), torch.cat([p.total for p in parts]))


def collect_groups(inputs: ExperienceInputs, stream: PromptStream, cfg: Config, device) -> tuple[Groups, dict]:
    """B scored groups; with dynamic sampling, groups whose rewards all tie are replaced by fresh ones
    (at most `max_sampling_tries` extra rounds; short batches are topped up with tied groups)."""
    B, G, algo = cfg.train.prompts_per_step, cfg.rollout.num_generations, cfg.algorithm
    rows, index = stream.next_indexed(B)                   # index: global draw positions, keys of the sampling
    first = draw_groups(inputs, rows, index, cfg, device)
    if not algo.dynamic_sampling:
        return first, dict(first.metrics)
    kept, spare, drawn, tries, sample_s = [], [], B, 0, first.sample_s
    errors = Counter(first.errors)
    current = first
    while True:
        informative = informative_groups(current.total, G).tolist()
        good = [i for i, ok in enumerate(informative) if ok]
        bad = [i for i, ok in enumerate(informative) if not ok]
        if good:
            kept.append(select_groups(current, group_rows(good, G)))
        if bad:
            spare.append(select_groups(current, group_rows(bad, G)))
        have = sum(p.total.numel() for p in kept) // G
        if have >= B or tries >= algo.max_sampling_tries:
            break
        tries += 1
        drawn += B - have
        rows, index = stream.next_indexed(B - have)        # fresh prompts: fresh keys
        current = draw_groups(inputs, rows, index, cfg, device)
        sample_s += current.sample_s
        errors.update(current.errors)
    informative_count = sum(p.total.numel() for p in kept) // G
    parts = kept + spare
    groups = select_groups(concat_groups(parts, inputs.tokenizer.pad_token_id), torch.arange(B * G, device="cpu"))
    groups.sample_s, groups.errors = sample_s, dict(errors)
    return groups, {**first.metrics, "sampling/groups_drawn": float(drawn), "sampling/extra_rounds": float(tries),
                    "sampling/informative_groups": float(min(informative_count, B))}


@torch.no_grad()
def process_token_advantages(tokenizer, groups: Groups, step_rewards: list, cfg: Config) -> torch.Tensor:
    """Process-supervision advantages of every completion token.  Shape: [N, T]."""
    gen = groups.gen
    token_texts = [[tokenizer.decode([t]) for t, m in zip(ids, mask) if m]
                   for ids, mask in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist())]
    step_ids = token_step_ids(token_texts, cfg.reward.step_delimiter, width=gen.completion_ids.shape[1])
    adv = process_advantages(step_rewards, step_ids, cfg.rollout.num_generations,
                             cfg.algorithm.advantage.params.eps)
    return adv.to(gen.completion_mask.device)                                  # host-side step table -> the batch


def make_experience(inputs: ExperienceInputs, stream: PromptStream, cfg: Config, device,
                    max_tokens: int | None = None) -> Experience:
    """Everything one GRPO step trains on (see the module docstring for the order of stages), from the next
    prompts of `stream` with `inputs` (:class:`ExperienceInputs`: policy, rewards, reference, env, critic, engine).
    `max_tokens`: the token budget of the reference / old-policy passes (the runtime's
    micro_batch_tokens; None = train.micro_batch_tokens resolved for the CPU)."""
    algo, ro, mb = cfg.algorithm, cfg.rollout, cfg.train.micro_batch_size
    model, tokenizer, rewards, step_rewards = inputs.model, inputs.tokenizer, inputs.rewards, inputs.step_rewards
    reference, critic = inputs.reference, inputs.critic
    G = ro.num_generations
    groups, metrics = collect_groups(inputs, stream, cfg, device)
    gen = groups.gen
    input_ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)                # [N, P + T]
    attention_mask = torch.cat([gen.prompt_mask, gen.completion_mask], dim=1)        # [N, P + T]
    T, mask = gen.completion_ids.shape[1], gen.loss_mask.float()        # [N, T] observation tokens: context only
    budget = micro_batch_tokens(cfg.train.micro_batch_tokens, model) if max_tokens is None else max_tokens
    extra = gen.model_inputs                                 # [N, ...] e.g. a VLM's pixel_values, with every forward
    host = HostView.of(input_ids, attention_mask)           # the rows on the host: one device read for both passes
    ref = (reference.logprobs(input_ids, attention_mask, T, ro.temperature, mb, max_tokens=budget, model_inputs=extra,
                              host=host) if reference is not None else None)
    needs_old = algo.updates_per_step > 1 or (algo.kl_in == "reward" and ref is not None)
    old = (fixed_logprobs(model, input_ids, attention_mask, T, ro.temperature, mb, max_tokens=budget, model_inputs=extra,
                          host=host) if needs_old else None)
    total = groups.total
    row_beta = (domain_betas(groups.columns.get(algo.domain_column, [None] * total.numel()), algo.beta_by_domain,
                             algo.beta, total.device) if algo.beta_by_domain else None)   # [N] per-domain beta
    if algo.kl_in == "reward" and ref is not None:       # PPO / REINFORCE++ style: KL leaves the loss
        kl = KL_ESTIMATORS[algo.kl_estimator](old, ref)                                # [N, T]
        total = kl_in_reward(total, kl, mask, algo.beta if row_beta is None else row_beta)   # beta [N] beside rewards
        beta = algo.beta if row_beta is None else row_beta.to(kl.device).unsqueeze(1)
        metrics["kl/reward_penalty_mean"] = float((beta * kl * mask).sum(dim=1).mean())
        ref = None                                       # nothing left for the loss
    if cfg.reward.functions:
        advantage = algo.advantage                                                    # {name, eps, scale_rewards}
        adv = (estimate_advantages(advantage, total, G) if critic is None                # Hybrid GRPO: V(q) mixed in,
               else critic.estimator(model, gen.prompt_ids, gen.prompt_mask)(            # grpo's eps and std
                   total, G, advantage.params.eps, advantage.params.scale_rewards))
    else:
        adv = Advantages(torch.zeros_like(total), 0, total.numel() // G)
    values = adv.values.to(input_ids.device)                   # [N] host-side rewards -> the batch's device
    values = advantage_variants(model, groups, [n for n, _ in rewards], total, values, input_ids, attention_mask, mask,
                                cfg, budget, metrics)          # entropy-shaped (EDGE, GTPO, GRPO-S), GRPO-LEAD weights
    if step_rewards:
        steps = score_steps(step_rewards, groups.prompts, chat_completions(groups.prompts, groups.completions),
                            reward_columns(groups.columns, gen), cfg.reward.step_delimiter, cfg.reward.timeout_s)
        values = ((values.unsqueeze(1) if values.dim() == 1 else values) * mask
                  + process_token_advantages(tokenizer, groups, steps, cfg))                            # [N, T]
    turn_rewards = groups.columns.get("turn_rewards")
    if gen.action_mask is not None and turn_rewards and any(turn_rewards):   # env info["reward"]: a step per turn
        values = ((values.unsqueeze(1) if values.dim() == 1 else values) * mask
                  + process_advantages(turn_rewards, turn_ids(gen.action_mask), G, algo.advantage.params.eps).to(mask.device))
    if algo.overlong_filter:                             # DAPO: truncated completions leave the loss
        mask = mask * overlong_keep(gen.truncated).unsqueeze(1)
        metrics["completion/overlong_filtered"] = float(gen.truncated.sum())
    if algo.top_entropy_rho < 1:                         # train on the highest-entropy tokens only
        entropy = fixed_logprobs(model, input_ids, attention_mask, T, ro.temperature, mb, max_tokens=budget,
                                 with_entropy=True, model_inputs=extra)[1]                   # [N, T] within the token budget
        mask = top_entropy_mask(entropy, mask, algo.top_entropy_rho)
    comparable = ro.temperature > 0 and ro.top_k == 0 and ro.top_p >= 1.0   # the sampler's own distribution
    sampled = gen.sampling_logprobs if comparable else None                 # [N, T]
    if old is not None and sampled is not None:          # the sampler vs a forward of the same policy
        metrics["rollout/logprob_diff"] = logprob_gap(old, sampled, gen.loss_mask)
    if algo.updates_per_step == 1:
        old = None                                       # pi_old = pi_theta.detach() in the update
    batch = TrainBatch(input_ids, attention_mask, mask, values.to(input_ids.device), old, ref, sampled,
                       None if row_beta is None else row_beta.to(input_ids.device), extra)
    scored = Scored(names=[n for n, _ in rewards], per_function=groups.per_function, total=total, errors=groups.errors)
    return Experience(batch, groups, scored, adv, metrics)
