"""The GRPO loop: read it top to bottom. No math here; every stage is a function of its own.

    [resume: restore every state from a checkpoint] -> experience (sample, score, filter,
    advantages) -> update (mu times) -> reference refresh -> metrics -> checkpoint

Reliability (docs/reliability.md): `train.resume` continues from the newest valid checkpoint
(grpo/resume.py); a first SIGINT/SIGTERM finishes the step, saves and returns (grpo/signals.py);
steps with a non-finite loss are skipped and `train.max_bad_steps` in a row stop the run without
saving that state (grpo/guards.py). `fault_point` calls are a test hook (GRPO_TEST_KILL_AT).
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

from grpo.config import Config, TrainConfig
from grpo.data import PromptStream, load_prompts
from grpo.experience import make_experience
from grpo.guards import BadSteps, deterministic_mode, prepare_output_dir
from grpo.kernels import set_mmap_threshold, use_cpu_matmul
from grpo.metrics import MetricsLogger, step_metrics
from grpo.reference import build_reference
from grpo.resume import TrainState, begin_run, check_resumable, find_checkpoint, restore, save_state
from grpo.rewards import load_reward
from grpo.signals import GracefulStop, fault_point
from grpo.types import TrainBatch
from grpo.update import UpdateStats, build_optimizer, micro_batch_tokens, policy_update


@dataclass
class TrainResult:
    model: torch.nn.Module
    tokenizer: Any
    steps: int                        # the last step done (max_steps unless stopped by a signal)
    output_dir: Path
    checkpoint: Path | None           # the newest checkpoint of the run (what --resume continues)
    wall_s: float
    stopped_by: str | None = None     # "SIGINT" / "SIGTERM" when a signal ended the run early
    signum: int = 0


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (a resumed run then restores their saved states)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_model(cfg: Config):
    """The policy and tokenizer named by `model.path` (or the embedded base policy), LoRA applied."""
    from grpo.lora import apply_lora
    from grpo.models import EMBEDDED_MODEL_DIR, load_policy

    path = cfg.model.path or str(EMBEDDED_MODEL_DIR)
    try:
        model, tokenizer = load_policy(path, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    except (ValueError, OSError):
        raise
    except Exception as e:  # e.g. safetensors' error for a torn weights file: one line naming the directory
        raise ValueError(f"cannot load a causal LM from {path}: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    return (apply_lora(model, cfg.lora) if cfg.lora.enabled else model), tokenizer


def mean_stats(stats: list[UpdateStats]) -> dict[str, float]:
    """Average the update statistics of the mu optimizer steps of one generation batch."""
    fields = [f.name for f in dataclasses.fields(UpdateStats)]
    return {f: float(np.mean([float(getattr(s, f)) for s in stats])) for f in fields}


def update(state: TrainState, batch: TrainBatch, cfg: Config, step: int, par=None) -> UpdateStats:
    """One optimizer update on the step's batch (the `update` test hook fires after it).
    `par`: the grpo.distributed.Parallel of a torchrun run (None in a single process)."""
    stats = policy_update(state.model if par is None else par.policy, state.optimizer, state.scheduler, batch, cfg.algorithm,
                          temperature=cfg.rollout.temperature, micro_batch_size=cfg.train.micro_batch_size,
                          max_grad_norm=cfg.optim.max_grad_norm,
                          norm_length=cfg.algorithm.loss_norm_length or cfg.rollout.max_new_tokens,
                          logprob_chunk_size=cfg.train.logprob_chunk_size,
                          gradient_checkpointing=cfg.train.gradient_checkpointing, parallel=par,
                          micro_batch_tokens=micro_batch_tokens(cfg.train.micro_batch_tokens, state.model))
    fault_point("update", step)
    return stats


def wants_checkpoint(tc: TrainConfig, step: int) -> bool:
    """Every `save_steps` steps, and at the end with `save_final`."""
    return bool(tc.save_steps and step % tc.save_steps == 0) or (tc.save_final and step == tc.max_steps)


def setup(cfg: Config, model, tokenizer) -> tuple[TrainState, Any, list, list]:
    """The training state at step 0, the prompt set and the reward functions (nothing written yet)."""
    tc, algo = cfg.train, cfg.algorithm
    rewards = [load_reward(spec) for spec in cfg.reward.functions]  # cheap checks first: fail fast
    step_rewards = [load_reward(spec) for spec in cfg.reward.process_functions]
    if model is None:
        model, tokenizer = load_model(cfg)
    use_cpu_matmul(model, cfg.model.cpu_matmul)              # oneDNN float32 GEMMs where faster (CPU only)
    prompt_set = load_prompts(cfg.data, tc.seed, tokenizer)   # rendered and tokenized once
    device = next(model.parameters()).device
    reference = build_reference(model, algo.beta)             # None when beta = 0
    optimizer, scheduler = build_optimizer(model, cfg.optim, tc.max_steps * algo.num_iterations)
    state = TrainState(model, tokenizer, optimizer, scheduler, reference,
                       PromptStream(prompt_set.rows, tc.seed, cfg.data.shuffle),
                       torch.Generator(device=device).manual_seed(tc.seed))
    return state, prompt_set, rewards, step_rewards


def save_distributed(out: Path, step: int, state: TrainState, cfg: Config, par) -> Path:
    """Every rank joins the gathering of the full state; rank 0 writes the checkpoint (see grpo.distributed)."""
    from grpo.distributed import all_gather_object, barrier

    optimizer = par.checkpoint_optimizer(state)
    samplers = all_gather_object(state.rng.get_state())
    path = out / f"checkpoint-{step}"
    if par.rank == 0:
        path = save_state(out, step, dataclasses.replace(state, optimizer=optimizer), cfg,
                          extra_rng={"samplers": samplers}, extra_info={"world_size": par.world_size})
    barrier()
    return path


def restore_sampler(state: TrainState, ckpt, cfg: Config, par) -> None:
    """Each rank's own sampling generator when the checkpoint has one for it (same world size), else
    rank 0 keeps the saved one and rank r > 0 is seeded from (seed + r, step)."""
    samplers = ckpt.rng.get("samplers")
    if samplers and len(samplers) == par.world_size:
        state.rng.set_state(samplers[par.rank])
    elif par.rank > 0:
        state.rng.manual_seed(cfg.train.seed + par.rank + 1_000_003 * ckpt.step)


def train(cfg: Config, model: torch.nn.Module | None = None, tokenizer: Any = None) -> TrainResult:
    """Run GRPO up to `cfg.train.max_steps` (from a checkpoint with `train.resume`); write metrics.jsonl,
    config.yaml and checkpoints. A first SIGINT/SIGTERM stops after the current step with a checkpoint.
    Under torchrun (WORLD_SIZE > 1) the run is data-parallel: see grpo/distributed.py."""
    from grpo import distributed

    par = distributed.init(cfg)                                # None in a single process
    if par is None:
        return _train(cfg, model, tokenizer, None)
    try:
        return _train(cfg, model, tokenizer, par)
    finally:
        distributed.shutdown(par)


def _train(cfg: Config, model, tokenizer, par) -> TrainResult:
    from grpo import distributed

    start = time.perf_counter()
    tc, algo = cfg.train, cfg.algorithm
    set_mmap_threshold(tc.mmap_threshold_mb)                  # freed host tensors go back to the OS
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    with deterministic_mode(tc.deterministic):
        seed_everything(tc.seed)
        out = prepare_output_dir(tc.output_dir)                # fails before anything is written
        state, prompt_set, rewards, step_rewards = setup(cfg, model, tokenizer)
        model, tokenizer, device = state.model, state.tokenizer, next(state.model.parameters()).device
        run_cfg = cfg                                          # torchrun: this rank's share of the prompts
        if par is not None:
            state.stream = distributed.ShardedStream(state.stream, par.rank, par.world_size)
            state.rng.manual_seed(tc.seed + par.rank)
            run_cfg = dataclasses.replace(cfg, train=dataclasses.replace(
                tc, prompts_per_step=tc.prompts_per_step // par.world_size))
        ckpt = find_checkpoint(cfg)                            # train.resume: never | auto | PATH
        if ckpt is not None:
            check_resumable(ckpt, cfg)
            restore(state, ckpt, cfg)
            if par is not None:
                restore_sampler(state, ckpt, cfg, par)
        if par is not None:
            par.prepare(state, cfg)
            distributed.barrier()
        if par is None or par.rank == 0:
            first = begin_run(out, cfg, ckpt)                  # config.yaml; metrics.jsonl cut to the resumed step
        else:
            first = (ckpt.step if ckpt else 0) + 1
        distributed.barrier()
        save = (lambda s: save_state(out, s, state, cfg)) if par is None else (
            lambda s: save_distributed(out, s, state, cfg, par))
        checkpoint, done, bad = (ckpt.path if ckpt else None), first - 1, BadSteps(tc.max_bad_steps)
        logger = (MetricsLogger(out / cfg.log.metrics_file, tc.max_steps, cfg.log.progress_bar, initial=done)
                  if par is None or par.rank == 0 else distributed.NullLogger())
        with logger, GracefulStop() as stop:
            for step in range(first, tc.max_steps + 1):
                t0 = time.perf_counter()
                exp = make_experience(model, tokenizer, state.stream, rewards, step_rewards, state.reference, run_cfg,
                                      state.rng, device)
                fault_point("rollout", step)
                t1 = time.perf_counter()
                stats = [update(state, exp.batch, cfg, step, par) for _ in range(algo.num_iterations)]
                if par is not None:
                    par.after_update(state)                    # FSDP2: new full weights into the rollout model
                times = {"update_s": time.perf_counter() - t1, "step_s": time.perf_counter() - t0,
                         "experience_s": t1 - t0}
                if state.reference is not None and algo.ref_update_steps and step % algo.ref_update_steps == 0:
                    state.reference.refresh(model, algo.ref_mix_alpha)   # iterative GRPO: the reference follows
                view = exp if par is None else distributed.global_experience(exp)   # rewards of every rank
                logger.log(step_metrics(step, view, mean_stats(stats), times, prompt_set))
                fault_point("step", step)
                done = step
                stop_now = stop.requested if par is None else distributed.any_rank(stop.requested)
                if bad.record(step, any(s.skipped for s in stats)):
                    bad.check(step, checkpoint)                # raises after max_bad_steps; never saves a bad state
                elif wants_checkpoint(tc, step) or stop_now:
                    logger.sync()
                    checkpoint = save(step)
                if stop_now:
                    break
        if tc.save_final and tc.max_steps == 0:
            checkpoint = save(0)
    return TrainResult(model, tokenizer, done, out, checkpoint, time.perf_counter() - start, stop.signal_name,
                       stop.signum)
