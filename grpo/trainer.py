"""The GRPO loop: read it top to bottom. No math here; every stage is a function of its own.

    prompts -> rollout -> rewards -> advantages -> logprobs(old, ref) -> update -> metrics
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from grpo.advantages import ADVANTAGE_ESTIMATORS
from grpo.config import Config, to_dict
from grpo.data import PromptStream, load_prompt_rows, tokenize_prompts
from grpo.logprobs import fixed_logprobs
from grpo.metrics import MetricsLogger, completion_metrics, reward_metrics
from grpo.rewards import load_reward, score
from grpo.rollout import Generation, sample
from grpo.types import TrainBatch
from grpo.update import UpdateStats, build_optimizer, policy_update


@dataclass
class TrainResult:
    model: torch.nn.Module
    tokenizer: Any
    steps: int
    output_dir: Path
    checkpoint: Path | None
    wall_s: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_model(cfg: Config):
    """The policy and tokenizer named by `model.path`, or the embedded base policy."""
    from grpo.models import EMBEDDED_MODEL_DIR, load_policy

    return load_policy(cfg.model.path or str(EMBEDDED_MODEL_DIR), dtype=cfg.model.dtype,
                       trust_remote_code=cfg.model.trust_remote_code)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference policy pi_ref: a frozen copy of the initial policy."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def decode_completions(tokenizer, gen: Generation) -> list[str]:
    """Completion texts without padding and without the closing EOS token."""
    texts = []
    for ids, mask in zip(gen.completion_ids.tolist(), gen.completion_mask.tolist()):
        ids = [t for t, m in zip(ids, mask) if m and t != tokenizer.eos_token_id]
        texts.append(tokenizer.decode(ids, skip_special_tokens=False))
    return texts


def repeat_each(values: list, times: int) -> list:
    """[a, b] -> [a, a, b, b] for times = 2: per-prompt values to per-completion values."""
    return [v for v in values for _ in range(times)]


def build_train_batch(gen: Generation, advantages: torch.Tensor, model, ref_model, cfg: Config) -> TrainBatch:
    """Sequences, mask, advantages, and the log-probs that stay fixed during the update."""
    input_ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)                # [N, P + T]
    attention_mask = torch.cat([gen.prompt_mask, gen.completion_mask], dim=1)        # [N, P + T]
    T, temp, mb = gen.completion_ids.shape[1], cfg.rollout.temperature, cfg.train.micro_batch_size
    old = fixed_logprobs(model, input_ids, attention_mask, T, temp, mb) if cfg.algorithm.num_iterations > 1 else None
    ref = fixed_logprobs(ref_model, input_ids, attention_mask, T, temp, mb) if ref_model is not None else None
    return TrainBatch(input_ids, attention_mask, gen.completion_mask.float(), advantages.to(input_ids.device),
                      old, ref)


def mean_stats(stats: list[UpdateStats]) -> dict[str, float]:
    """Average the update statistics of the mu optimizer steps of one generation batch."""
    fields = [f.name for f in dataclasses.fields(UpdateStats)]
    return {f: float(np.mean([float(getattr(s, f)) for s in stats])) for f in fields}


def save_policy(model, tokenizer, path: Path) -> Path:
    """Hugging Face format: `from_pretrained(path)` loads it back."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train(cfg: Config, model: torch.nn.Module | None = None, tokenizer: Any = None) -> TrainResult:
    """Run `cfg.train.max_steps` GRPO steps; write metrics.jsonl, config.yaml, the final policy."""
    start = time.perf_counter()
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    seed_everything(cfg.train.seed)
    rewards = [load_reward(spec) for spec in cfg.reward.functions]  # cheap checks first: fail fast
    stream = PromptStream(load_prompt_rows(cfg.data, cfg.train.seed), cfg.train.seed, cfg.data.shuffle)
    if model is None:
        model, tokenizer = load_model(cfg)
    device = next(model.parameters()).device
    ref_model = frozen_copy(model) if cfg.algorithm.beta > 0 else None   # beta = 0: no reference at all
    optimizer, scheduler = build_optimizer(model, cfg.optim, cfg.train.max_steps * cfg.algorithm.num_iterations)
    rng = torch.Generator(device=device).manual_seed(cfg.train.seed)
    out = Path(cfg.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    logger = MetricsLogger(out / cfg.log.metrics_file, cfg.train.max_steps, cfg.log.progress_bar)
    G, ro, algo = cfg.rollout.num_generations, cfg.rollout, cfg.algorithm

    for step in range(1, cfg.train.max_steps + 1):
        t0 = time.perf_counter()
        prompts = tokenize_prompts(tokenizer, stream.next(cfg.train.prompts_per_step), device)   # [B, P]
        gen = sample(model, prompts.prompt_ids, prompts.prompt_mask, num_generations=G,
                     max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
                     top_k=ro.top_k, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=rng)                   # [N, T]
        t_rollout = time.perf_counter() - t0
        completions = decode_completions(tokenizer, gen)
        scored = score(rewards, cfg.reward.weights, repeat_each(prompts.prompts, G), completions,
                       {k: repeat_each(v, G) for k, v in prompts.columns.items()})
        adv = ADVANTAGE_ESTIMATORS[algo.advantage_estimator](scored.total, G, algo.advantage_eps)  # [N]
        batch = build_train_batch(gen, adv.values, model, ref_model, cfg)
        t1 = time.perf_counter()
        stats = [policy_update(model, optimizer, scheduler, batch, algo, temperature=ro.temperature,
                               micro_batch_size=cfg.train.micro_batch_size,
                               max_grad_norm=cfg.optim.max_grad_norm,
                               norm_length=algo.loss_norm_length or ro.max_new_tokens)
                 for _ in range(algo.num_iterations)]
        t_update, t_step = time.perf_counter() - t1, time.perf_counter() - t0
        u = mean_stats(stats)
        logger.log({
            "step": step, **reward_metrics(scored), **completion_metrics(gen.completion_mask, gen.truncated),
            "advantages/zero_std_frac": adv.zero_std_groups / adv.num_groups,
            "loss/total": u["loss"], "loss/policy": u["policy_loss"], "loss/kl": u["kl_loss"],
            "kl/mean": u["kl"], "policy/clip_frac": u["clip_fraction"], "policy/entropy": u["entropy"],
            "optim/grad_norm": u["grad_norm"], "optim/lr": u["lr"], "optim/skipped_steps": u["skipped"],
            "time/step_s": t_step, "time/rollout_s": t_rollout, "time/update_s": t_update,
            "rollout/tokens_per_s": float(gen.completion_mask.sum()) / max(t_rollout, 1e-9),
        })
    logger.close()
    ckpt = save_policy(model, tokenizer, out / f"checkpoint-{cfg.train.max_steps}") if cfg.train.save_final else None
    return TrainResult(model, tokenizer, cfg.train.max_steps, out, ckpt, time.perf_counter() - start)
