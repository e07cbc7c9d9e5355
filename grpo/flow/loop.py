"""The Flow-GRPO loop: a sibling of grpo/training/loop.py in the same order of stages (docs/flow.md).

    [resume: restore every state from a checkpoint] -> experience (SDE rollouts, rewards, advantages)
    -> update (flow.updates_per_step optimizer steps) -> [held-out evaluation] -> metrics -> health rules
    -> callbacks -> checkpoint

It shares the run skeleton of text runs (grpo/training/skeleton.py: exact resume, the health monitor,
metrics.jsonl, callbacks, the graceful stop on SIGINT / SIGTERM, checkpoints), the output-dir lock
(grpo/state/) and the optimizer and LR schedule (grpo.training.update.build_optimizer). What differs is the experience (images, not tokens) and the
update (per (sample, step) pairs), which is why it is not a branch inside the text loop.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.config import Config, ConfigError
from grpo.flow.evaluate import evaluate
from grpo.flow.experience import PromptStream, make_experience, step_generator
from grpo.flow.models import FlowModel, load_flow_model
from grpo.flow.tasks import TASKS, FlowTask, run_prompts
from grpo.flow.update import flow_update
from grpo.flow.variants import VARIANTS
from grpo.state.output_dir import OutputDirLock, prepare_output_dir
from grpo.training.callbacks import CallbackList
from grpo.training.loop import seed_everything
from grpo.training.runtime import resolve_device
from grpo.training.skeleton import Run, resume
from grpo.training.update import build_optimizer
from grpo.training.world import LocalWorld
from grpo.types import TrainState


class LabelVocab:
    """The flow model's "tokenizer": the task's label fields, saved beside the weights."""

    def __init__(self, task: str, vocab: list[int]):
        self.task, self.vocab = task, vocab

    def save_pretrained(self, path: str | Path) -> None:
        import json

        (Path(path) / "labels.json").write_text(json.dumps({"task": self.task, "vocab": self.vocab}))


@dataclass
class FlowResult:
    model: FlowModel
    steps: int
    output_dir: Path
    checkpoint: Path | None
    wall_s: float
    stopped_by: str | None = None
    signum: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)     # the last step's record
    held_out: Any = None                                      # the task's held-out prompts


def check_flow_config(cfg: Config) -> FlowTask:
    """The registry names of the flow section, with errors naming the key; returns the task."""
    fc = cfg.flow
    for key, value, registry in (("flow.task", fc.task, TASKS), ("flow.variant", fc.variant, VARIANTS)):
        if value not in registry:
            raise ConfigError(f"{key} must be one of {sorted(registry)}, got {value!r}")
    task = TASKS[fc.task]
    if fc.reward not in task.rewards:
        raise ConfigError(f"flow.reward must be one of {sorted(task.rewards)} for flow.task={fc.task}, got {fc.reward!r}")
    if fc.beta > 0 and not VARIANTS[fc.variant].kl:
        raise ConfigError(f"flow.beta must be 0 with flow.variant={fc.variant} (it trains without a KL term)")
    return task


def model_dir(path: str) -> Path:
    """flow.model as a directory: as given, or (the default grpo/assets/shapes-flow) relative to the
    installed package's parent, so the embedded base model is found from any working directory."""
    given = Path(path).expanduser()
    packaged = Path(__file__).resolve().parents[2] / path
    return given if given.is_dir() or given.is_absolute() or not packaged.is_dir() else packaged


def load_model(cfg: Config, task: FlowTask, device: torch.device) -> FlowModel:
    """flow.model (a directory), or a new model of the task with flow.model_* sizes (seeded by train.seed)."""
    if cfg.flow.model:
        return load_flow_model(model_dir(cfg.flow.model), device)
    torch.manual_seed(cfg.train.seed)
    with torch.device(device):
        return task.new_model(cfg.flow)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The KL reference: a frozen copy of the initial model (the flow models have no peft adapters)."""
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    return ref


def run_flow(cfg: Config, model: FlowModel | None = None, callbacks: CallbackList | None = None) -> FlowResult:
    """Train `model` (default: flow.model) with Flow-GRPO up to train.max_steps; metrics.jsonl, alerts.jsonl,
    config.yaml and checkpoints go to train.output_dir as in text runs."""
    task = check_flow_config(cfg)
    out = prepare_output_dir(cfg.train.output_dir)
    with OutputDirLock(out):
        return _run(cfg, task, model, callbacks or CallbackList(), out)


def _run(cfg: Config, task: FlowTask, model: FlowModel | None, callbacks: CallbackList, out: Path) -> FlowResult:
    start = time.perf_counter()
    tc, fc = cfg.train, cfg.flow
    seed_everything(tc.seed)
    # model.device (auto: CUDA when available) for a model loaded here; a given model stays where it is
    device = resolve_device(cfg.model.device) if model is None else next(model.parameters()).device
    model = load_model(cfg, task, device) if model is None else model
    train_prompts, held_out = run_prompts(task, fc)
    reference = frozen_copy(model) if VARIANTS[fc.variant].kl else None
    optimizer, scheduler = build_optimizer(model, cfg.optim, tc.max_steps * fc.updates_per_step)
    state = TrainState(model, LabelVocab(fc.task, task.vocab), optimizer, scheduler, reference,
                       PromptStream(train_prompts, tc.seed))
    run = Run(cfg, out, state, LocalWorld(), callbacks, resume(state, cfg))   # grpo/training/skeleton.py
    with run:                                                            # metrics.jsonl, SIGINT / SIGTERM
        for step in run.steps():
            t0 = time.perf_counter()
            exp = make_experience(model, task, state.stream.next_batch(fc.prompts_per_step), cfg, step, device)
            t1 = time.perf_counter()
            g = step_generator(tc.seed + 1, step, device)                 # the update's shuffle, keyed too
            stats = flow_update(model, reference, optimizer, scheduler, exp, fc, cfg.optim.max_grad_norm, g)
            record = {"step": step, **exp.metrics, **update_metrics(stats),
                      "time/experience_s": t1 - t0, "time/update_s": time.perf_counter() - t1,
                      "time/step_s": time.perf_counter() - t0}
            if fc.eval_every and step % fc.eval_every == 0:
                record.update({f"eval/{k}": v for k, v in evaluate(model, task, held_out, cfg).items()})
            run.log(step, record)                                        # the first: trackers, begin_run
            run.end_step(step)                                           # alerts, callbacks, checkpoint or stop
    result = FlowResult(model, run.done, out, run.checkpoint, time.perf_counter() - start, run.stopped_by, run.signum,
                        run.record, held_out)
    callbacks.train_end(result)
    return result


def update_metrics(stats: list) -> dict[str, float]:
    """The mean of the optimizer steps' statistics under the text runs' metric names."""
    mean = lambda f: float(np.mean([getattr(s, f) for s in stats]))   # noqa: E731
    return {"loss/total": mean("loss"), "loss/policy": mean("policy_loss"), "kl/mean": mean("kl"),
            "policy/clip_frac": mean("clip_fraction"), "optim/grad_norm": mean("grad_norm"), "optim/lr": mean("lr"),
            "flow/ratio_max_dev": max(s.ratio_max_dev for s in stats)}
