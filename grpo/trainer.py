"""The GRPO loop: read it top to bottom. No math here; every stage is a function of its own.

    experience (sample, score, filter, advantages) -> update (mu times) -> reference refresh
    -> metrics -> checkpoint
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from grpo.checkpoint import rng_state, save_checkpoint
from grpo.config import Config, to_dict
from grpo.data import PromptStream, load_prompts
from grpo.experience import make_experience
from grpo.metrics import MetricsLogger, completion_metrics, reward_metrics
from grpo.reference import build_reference
from grpo.rewards import load_reward
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
    """The policy and tokenizer named by `model.path` (or the embedded base policy), LoRA applied."""
    from grpo.lora import apply_lora
    from grpo.models import EMBEDDED_MODEL_DIR, load_policy

    model, tokenizer = load_policy(cfg.model.path or str(EMBEDDED_MODEL_DIR), dtype=cfg.model.dtype,
                                   trust_remote_code=cfg.model.trust_remote_code)
    return (apply_lora(model, cfg.lora) if cfg.lora.enabled else model), tokenizer


def mean_stats(stats: list[UpdateStats]) -> dict[str, float]:
    """Average the update statistics of the mu optimizer steps of one generation batch."""
    fields = [f.name for f in dataclasses.fields(UpdateStats)]
    return {f: float(np.mean([float(getattr(s, f)) for s in stats])) for f in fields}


def train(cfg: Config, model: torch.nn.Module | None = None, tokenizer: Any = None) -> TrainResult:
    """Run `cfg.train.max_steps` GRPO steps; write metrics.jsonl, config.yaml and checkpoints."""
    start = time.perf_counter()
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    seed_everything(cfg.train.seed)
    rewards = [load_reward(spec) for spec in cfg.reward.functions]  # cheap checks first: fail fast
    step_rewards = [load_reward(spec) for spec in cfg.reward.process_functions]
    if model is None:
        model, tokenizer = load_model(cfg)
    prompt_set = load_prompts(cfg.data, cfg.train.seed, tokenizer)   # rendered and tokenized once
    stream = PromptStream(prompt_set.rows, cfg.train.seed, cfg.data.shuffle)
    device = next(model.parameters()).device
    reference = build_reference(model, cfg.algorithm.beta)     # None when beta = 0
    optimizer, scheduler = build_optimizer(model, cfg.optim, cfg.train.max_steps * cfg.algorithm.num_iterations)
    rng = torch.Generator(device=device).manual_seed(cfg.train.seed)
    out = Path(cfg.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    logger = MetricsLogger(out / cfg.log.metrics_file, cfg.train.max_steps, cfg.log.progress_bar)
    ro, algo, tc = cfg.rollout, cfg.algorithm, cfg.train
    checkpoint = None

    for step in range(1, tc.max_steps + 1):
        t0 = time.perf_counter()
        exp = make_experience(model, tokenizer, stream, rewards, step_rewards, reference, cfg, rng, device)
        t1 = time.perf_counter()
        stats = [policy_update(model, optimizer, scheduler, exp.batch, algo, temperature=ro.temperature,
                               micro_batch_size=tc.micro_batch_size, max_grad_norm=cfg.optim.max_grad_norm,
                               norm_length=algo.loss_norm_length or ro.max_new_tokens)
                 for _ in range(algo.num_iterations)]
        t_update, t_step = time.perf_counter() - t1, time.perf_counter() - t0
        if reference is not None and algo.ref_update_steps and step % algo.ref_update_steps == 0:
            reference.refresh(model, algo.ref_mix_alpha)       # iterative GRPO: the reference follows
        u, gen = mean_stats(stats), exp.groups.gen
        logger.log({
            "step": step, **reward_metrics(exp.scored), **completion_metrics(gen.completion_mask, gen.truncated),
            **exp.metrics, "advantages/zero_std_frac": exp.advantages.zero_std_groups / exp.advantages.num_groups,
            "loss/total": u["loss"], "loss/policy": u["policy_loss"], "loss/kl": u["kl_loss"],
            "kl/mean": u["kl"], "policy/clip_frac": u["clip_fraction"], "policy/entropy": u["entropy"],
            "optim/grad_norm": u["grad_norm"], "optim/lr": u["lr"], "optim/skipped_steps": u["skipped"],
            "time/step_s": t_step, "time/rollout_s": exp.groups.sample_s, "time/experience_s": t1 - t0,
            "time/update_s": t_update,
            "rollout/tokens_per_s": float(gen.completion_mask.sum()) / max(exp.groups.sample_s, 1e-9),
            "data/dropped_prompts": prompt_set.num_dropped, "data/truncated_prompts": prompt_set.num_truncated,
        })
        if (tc.save_steps and step % tc.save_steps == 0) or (tc.save_final and step == tc.max_steps):
            checkpoint = save_checkpoint(out, step, model, tokenizer, optimizer=optimizer, scheduler=scheduler,
                                         state={"max_steps": tc.max_steps, "epoch": stream.epoch},
                                         rng=rng_state(rng), save_total_limit=tc.save_total_limit)
    logger.close()
    if tc.save_final and tc.max_steps == 0:
        checkpoint = save_checkpoint(out, 0, model, tokenizer)
    return TrainResult(model, tokenizer, tc.max_steps, out, checkpoint, time.perf_counter() - start)
