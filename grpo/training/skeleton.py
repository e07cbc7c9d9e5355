"""The run skeleton of both loops (grpo/training/loop.py and grpo/flow/loop.py): resume, the health
monitor, metrics.jsonl, the graceful stop and checkpoints. A loop does its step; the skeleton everything
around it, in one order for text and flow runs:

    resume(state) -> Run(...): announce, health monitor -> with run: logger, SIGINT/SIGTERM
    -> for step in run.steps(): <the loop's step> -> run.log(step, record): [first step: trackers, begin_run]
       health rules, metrics line -> run.end_step(step): alerts, callbacks, checkpoint or stop
    -> run.stopped_by

Reliability (docs/reliability.md): a first SIGINT/SIGTERM, a callback asking to stop or a health rule in
`health.halt_on` ends the run after the current step with a checkpoint; `train.max_bad_steps` skipped
steps in a row stop it without saving that state (grpo/training/guards.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from grpo.config import Config
from grpo.events import emit
from grpo.health import HealthMonitor
from grpo.state.resume import TrainState, announce_run, begin_run, check_resumable, find_checkpoint, restore
from grpo.state.signals import GracefulStop
from grpo.training.callbacks import CallbackList
from grpo.training.guards import BadSteps


def resume(state: TrainState, cfg: Config):
    """train.resume (never | auto | PATH): the checkpoint to continue from, checked and restored into
    `state` (every state: weights, optimizer, scheduler, RNGs, the prompt stream); None for a new run."""
    ckpt = find_checkpoint(cfg)
    if ckpt is not None:
        check_resumable(ckpt, cfg)
        restore(state, ckpt, cfg)
    return ckpt


def wants_checkpoint(tc, step: int) -> bool:
    """Every `save_steps` steps, and at the end with `save_final`."""
    return bool(tc.save_steps and step % tc.save_steps == 0) or (tc.save_final and step == tc.max_steps)


class Run:
    """One run's steps from `first` to train.max_steps, and what happens between them. `world` is
    grpo.training.world's LocalWorld or TorchrunWorld (rank 0 writes; stop and save are agreed by all)."""

    def __init__(self, cfg: Config, out: Path, state: TrainState, world, callbacks: CallbackList, ckpt=None):
        self.cfg, self.out, self.state, self.world, self.callbacks, self.ckpt = cfg, out, state, world, callbacks, ckpt
        self.first = announce_run(out, cfg, ckpt) if world.is_main else (ckpt.step if ckpt else 0) + 1
        self.health = HealthMonitor(cfg, out, self.first, enabled=world.is_main)   # reads back a resumed run's history
        self.checkpoint: Path | None = ckpt.path if ckpt else None   # the newest checkpoint (what --resume continues)
        self.done = self.first - 1                                     # the last step done
        self.record: dict[str, Any] = {}                               # the last step's metrics record
        self.bad = BadSteps(cfg.train.max_bad_steps)
        self._findings: list = []
        self._stop_now = False
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Run":
        tc = self.cfg.train
        self.logger = self._stack.enter_context(self.world.logger(
            self.out / self.cfg.log.metrics_file, tc.max_steps, self.cfg.log.progress_bar, initial=self.done,
            config=self.cfg))
        self.stop = self._stack.enter_context(GracefulStop())
        return self

    def __exit__(self, *exc) -> bool | None:
        return self._stack.__exit__(*exc)

    def steps(self) -> Iterator[int]:
        """first .. train.max_steps, until a stop was asked for (after that step's checkpoint)."""
        for step in range(self.first, self.cfg.train.max_steps + 1):
            yield step
            if self._stop_now:
                break

    def log(self, step: int, record: dict[str, Any]) -> None:
        """The step's record: the first step commits the run (trackers, begin_run: the first write), the
        health rules add their health/<rule> levels, then the metrics.jsonl line."""
        if step == self.first and self.world.is_main:
            self.logger.start_trackers()                   # a tracker failing to start changes nothing here
            begin_run(self.out, self.cfg, self.ckpt)       # the first write: step `first` worked, so commit
        self._findings = self.health.observe(record)
        self.logger.log(record)
        self.record = record

    def end_step(self, step: int, skipped: bool = False) -> None:
        """After the step's record: alerts, callbacks, and a checkpoint every train.save_steps, at the end,
        or before a stop; `skipped`: the step's update was skipped (non-finite), nothing of it is saved."""
        world, callbacks = self.world, self.callbacks
        self.health.report(self._findings)                 # console, alerts.jsonl
        callbacks.alert(self._findings)
        asked = callbacks.step_end(step, self.record) or self.health.halt is not None   # health.halt_on
        emit("step", step)
        self.done = step
        self._stop_now = world.any(self.stop.requested or asked)
        asked_save = world.any(callbacks.take_request("save"))   # a TrainerCallback's control.should_save
        if self.bad.record(step, skipped):
            self.bad.check(step, self.checkpoint)           # raises after max_bad_steps; never saves a bad state
        elif wants_checkpoint(self.cfg.train, step) or self._stop_now or asked_save:
            self.logger.sync()
            self.checkpoint = world.save(self.out, step, self.state, self.cfg)
            callbacks.checkpoint(self.checkpoint)

    @property
    def stopped_by(self) -> str | None:
        """"SIGINT" / "SIGTERM" / "health" / "callback" when the run ended before train.max_steps."""
        early = self.done < self.cfg.train.max_steps
        return self.stop.signal_name or ("health" if self.health.halt is not None and early else None) or (
            "callback" if self.callbacks.stop_requested and early else None)

    @property
    def signum(self) -> int:
        return self.stop.signum
