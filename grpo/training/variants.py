"""Wiring of the reward and advantage variants into one step's experience; the math is in
grpo/algorithms/lead.py (GRPO-LEAD) and grpo/algorithms/entropy_advantages.py (EDGE-GRPO, GTPO, GRPO-S).

    scored groups -> [guided error correction] -> [GRPO-LEAD correctness reward] -> total
    advantages    -> [entropy-shaped advantages] -> [difficulty weights]          -> the batch

Each stage is chosen by a config key and is the identity when off.
"""

from __future__ import annotations

import torch

from grpo.algorithms.advantages import estimate_advantages
from grpo.algorithms.entropy_advantages import ENTROPY_ADVANTAGES, guided_correction_rows
from grpo.algorithms.lead import DIFFICULTY_WEIGHTINGS, lead_correctness_reward
from grpo.config import Config
from grpo.modeling.logprobs import fixed_logprobs
from grpo.rewards import score
from grpo.rewards.text import chat_completions
from grpo.types import Generation, Groups, Scored


def correctness_column(names: list[str], cfg: Config) -> int:
    """Index of ``algorithm.correctness_reward`` among the reward functions (empty: the first)."""
    name = cfg.algorithm.correctness_reward
    if not name:
        return 0
    if name not in names:
        raise ValueError(f"algorithm.correctness_reward '{name}' is not one of the reward functions {names}")
    return names.index(name)


def correctness(per_function: torch.Tensor, names: list[str], cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, rewarded): the correctness reward > 0, and it is not None.  [N, R] -> [N] bool x2."""
    if per_function.shape[1] == 0:
        none = torch.zeros(per_function.shape[0], dtype=torch.bool, device=per_function.device)
        return none, none
    col = per_function[:, correctness_column(names, cfg)]
    return col > 0, torch.isfinite(col)


def _combine(per_function: torch.Tensor, cfg: Config, combine) -> torch.Tensor:
    weights = cfg.reward.weights or [1.0] * per_function.shape[1]
    return combine(per_function, torch.tensor(weights, dtype=torch.float32, device=per_function.device))


def _with_rows(gen: Generation, rows: list[int], ids: list[list[int]], pad: int, logp: torch.Tensor | None) -> Generation:
    """`gen` with the completions of `rows` replaced by `ids` (widened when one is longer)."""
    width = max([gen.completion_ids.shape[1]] + [len(x) for x in ids])
    grow = width - gen.completion_ids.shape[1]
    widen = lambda t, v: torch.nn.functional.pad(t, (0, grow), value=v) if grow else t.clone()  # noqa: E731
    cids, cmask, slp = widen(gen.completion_ids, pad), widen(gen.completion_mask, 0), widen(gen.sampling_logprobs, 0.0)
    action = None if gen.action_mask is None else widen(gen.action_mask, 0)
    trunc = gen.truncated.clone()
    for row, x in zip(rows, ids):
        cids[row] = pad
        cids[row, :len(x)] = torch.tensor(x, dtype=cids.dtype, device=cids.device)
        cmask[row] = 0
        cmask[row, :len(x)] = 1
        slp[row] = 0.0
        trunc[row] = False
        if action is not None:
            action[row] = cmask[row]
    if logp is not None:                                   # the policy's own log-probs of the injected rows
        slp[rows] = (logp * cmask[rows]).to(slp.dtype)
    return Generation(gen.prompt_ids, gen.prompt_mask, cids, cmask, slp, trunc, action, gen.model_inputs)


def guided_error_correction(model, tokenizer, gen: Generation, completions: list[str], prompts: list, columns: dict,
                            scored: Scored, rewards, cfg: Config, group_size: int, combine):
    """EDGE-GRPO guided error correction: in every group with no correct completion whose row has a
    reference solution (column ``algorithm.solution_column``), the last completion becomes that
    solution (+ EOS, cut at rollout.max_new_tokens) and is scored again with every reward function.

    Its sampling log-probs are the policy's own (one no-grad pass over those rows): the injected text
    trains as if sampled, without rollout-correction weights. Returns (gen, completions, scored, count).
    """
    solutions = columns.get(cfg.algorithm.solution_column)
    if solutions is None:
        return gen, completions, scored, 0
    correct, rewarded = correctness(scored.per_function, scored.names, cfg)
    has = torch.tensor([bool(solutions[i * group_size]) for i in range(len(solutions) // group_size)],
                       dtype=torch.bool, device=correct.device)                                   # [B]
    rows = guided_correction_rows(correct, rewarded, has, group_size).tolist()
    if not rows:
        return gen, completions, scored, 0
    cap = cfg.rollout.max_new_tokens
    ids = [(tokenizer(str(solutions[r]), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:cap]
           for r in rows]
    width = max([gen.completion_ids.shape[1]] + [len(x) for x in ids])
    draft = _with_rows(gen, rows, ids, tokenizer.pad_token_id, None)
    sub = torch.tensor(rows, dtype=torch.long, device=gen.prompt_ids.device)
    input_ids = torch.cat([draft.prompt_ids[sub], draft.completion_ids[sub]], dim=1)              # [M, P + T]
    attn = torch.cat([draft.prompt_mask[sub], draft.completion_mask[sub]], dim=1)
    logp = fixed_logprobs(model, input_ids, attn, width, cfg.rollout.temperature)                 # [M, T]
    gen = _with_rows(gen, rows, ids, tokenizer.pad_token_id, logp)
    completions = list(completions)
    for r in rows:
        completions[r] = str(solutions[r])
    sub_prompts = [prompts[r] for r in rows]
    sub_columns = {k: [v[r] for r in rows] for k, v in columns.items()}
    sub_columns["completion_ids"] = ids
    again = score(rewards, cfg.reward.weights, sub_prompts, chat_completions(sub_prompts, [completions[r] for r in rows]),
                  sub_columns, on_error=cfg.reward.reward_errors, timeout_s=cfg.reward.timeout_s)
    per_function = scored.per_function.clone()
    per_function[sub.to(per_function.device)] = again.per_function.to(per_function)
    total = _combine(per_function, cfg, combine)
    return gen, completions, Scored(scored.names, per_function, total, scored.errors), len(rows)


def reward_variants(model, tokenizer, gen: Generation, completions: list[str], prompts: list, columns: dict,
                    scored: Scored, rewards, cfg: Config, group_size: int, combine):
    """Guided error correction, then GRPO-LEAD's correctness reward; the total recombined.
    Returns (gen, completions, scored, metrics); metrics: ``advantages/gec_injected`` (completions replaced),
    ``reward/<correctness fn>/raw_mean`` (its mean before GRPO-LEAD reshapes it: the accuracy, where
    ``reward/<fn>/mean`` is the reshaped reward's)."""
    algo, metrics = cfg.algorithm, {}
    if algo.guided_error_correction:
        gen, completions, scored, injected = guided_error_correction(model, tokenizer, gen, completions, prompts,
                                                                     columns, scored, rewards, cfg, group_size, combine)
        metrics["advantages/gec_injected"] = float(injected)
    if (algo.length_reward_alpha > 0 or algo.wrong_answer_penalty > 0) and scored.per_function.shape[1]:
        col = correctness_column(scored.names, cfg)
        per_function = scored.per_function.clone()
        raw = per_function[:, col]
        metrics[f"reward/{scored.names[col]}/raw_mean"] = float(raw.nan_to_num(0).sum() / raw.isfinite().sum().clamp(min=1))
        lengths = gen.completion_mask.sum(dim=1).to(per_function.device)
        per_function[:, col] = lead_correctness_reward(per_function[:, col], lengths, group_size,
                                                       algo.length_reward_alpha, algo.wrong_answer_penalty)
        scored = Scored(scored.names, per_function, _combine(per_function, cfg, combine), scored.errors)
    return gen, completions, scored, metrics


def advantage_variants(model, groups: Groups, names: list[str], total: torch.Tensor, values: torch.Tensor,
                       input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor, cfg: Config,
                       budget: int, metrics: dict) -> torch.Tensor:
    """Entropy-shaped advantages (``algorithm.entropy_advantage``), then difficulty weights
    (``algorithm.difficulty_weighting``).  values [N] -> [N] or [N, T] on values' device."""
    algo, G = cfg.algorithm, cfg.rollout.num_generations
    correct, rewarded = correctness(groups.per_function, names, cfg)
    correct, rewarded = correct.to(values.device), rewarded.to(values.device)
    shape, shaping = ENTROPY_ADVANTAGES[algo.entropy_advantage.name], vars(algo.entropy_advantage.params)
    if shape is not None:
        T = mask.shape[1]
        entropy = fixed_logprobs(model, input_ids, attention_mask, T, cfg.rollout.temperature,
                                 cfg.train.micro_batch_size, max_tokens=budget, with_entropy=True)[1]   # [N, T]
        estimate = lambda r: estimate_advantages(algo.advantage, r, G).values  # noqa: E731
        values = shape(total.to(values.device), values, correct, entropy, mask, G, shaping.get("reward_weight", 0.0),
                       estimate, algo.advantage.params.eps).to(torch.float32)
        metrics["advantages/entropy_mean"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    weighting = algo.difficulty_weighting                                  # {name, w_min, w_max, midpoint, steepness}
    values = DIFFICULTY_WEIGHTINGS[weighting.name](values, correct, rewarded, G, **vars(weighting.params))
    return values
