"""Callbacks: user objects the loop calls at fixed points of a run.

A callback is any object with some of these methods (missing ones are skipped)::

    on_step_end(step: int, metrics: dict) -> bool | None   # after each step's metrics are logged
    on_checkpoint(path: Path) -> None                        # after a checkpoint is written
    on_alert(finding: grpo.health.Finding) -> None          # a new or worse health finding (docs/health.md)
    on_train_end(result: TrainResult) -> None                # once, when the run returns

``on_step_end`` returning True (or the string "stop") asks the run to stop: it stops as it does on
SIGINT, after that step, with a checkpoint saved (``TrainResult.stopped_by == "callback"``).
:meth:`grpo.Trainer.stop` does the same from anywhere (another thread, a notebook cell).
An exception raised by a callback ends the run with that exception (nothing more is saved).
A Hugging Face ``TrainerCallback`` (as TRL takes them) is called with its own protocol
(grpo/training/hf_callbacks.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The methods a callback may have, in the order a run calls them.
HOOKS = ("on_alert", "on_step_end", "on_checkpoint", "on_train_end")


class Callback:
    """A base with no-op hooks (optional: any object with some of the methods works)."""

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> bool | None:
        return None

    def on_checkpoint(self, path: Path) -> None:
        return None

    def on_alert(self, finding: Any) -> None:
        return None

    def on_train_end(self, result: Any) -> None:
        return None


def check_callback(cb: Any, index: int) -> Any:
    """`cb` when it has at least one hook, else a one-line TypeError naming it."""
    if not any(callable(getattr(cb, hook, None)) for hook in HOOKS):
        raise TypeError(f"callbacks[{index}] ({type(cb).__name__}) has none of the methods {', '.join(HOOKS)}")
    return cb


class CallbackList:
    """The run's callbacks, called in order; also holds a stop request made from outside the loop."""

    def __init__(self, callbacks: list | tuple | None = None, cfg: Any = None):
        from grpo.training.hf_callbacks import HFCallbacks, is_hf_callback   # TRL's TrainerCallback objects

        callbacks = list(callbacks or [])
        hf = [cb for cb in callbacks if is_hf_callback(cb)]
        self.hf = HFCallbacks(hf, cfg)        # all TrainerCallbacks, one state and control, at the first one's place
        at = next((i for i, cb in enumerate(callbacks) if is_hf_callback(cb)), len(callbacks))
        self.callbacks = [check_callback(cb, i) for i, cb in enumerate(callbacks) if not is_hf_callback(cb)]
        self.callbacks.insert(sum(not is_hf_callback(cb) for cb in callbacks[:at]), self.hf)
        self.stop_requested = False

    def add(self, cb: Any) -> None:
        """Add a callback (a TrainerCallback instance or class joins the Hugging Face ones)."""
        from grpo.training.hf_callbacks import is_hf_callback

        if is_hf_callback(cb):
            self.hf.add(cb)
        else:
            self.callbacks.append(check_callback(cb, len(self.callbacks)))

    def pop(self, cb: Any) -> Any:
        """Remove and return `cb` (an instance, or the first instance of a class); None when absent."""
        for c in self.callbacks:
            if c is not self.hf and (isinstance(c, cb) if isinstance(cb, type) else c == cb):
                self.callbacks.remove(c)
                return c
        return self.hf.pop(cb)

    def init_end(self, model: Any, tokenizer: Any) -> None:
        """The Trainer is built (Hugging Face's on_init_end)."""
        self.hf.init_end(model, tokenizer)

    def train_begin(self, state: Any, progress: Any, first: int) -> None:
        """Before the run's first step `first`: `state` is the loop's TrainState, `progress` its
        grpo.training.trl_view.TrlProgress (Hugging Face's on_train_begin, on_epoch_begin)."""
        self.hf.train_begin(state, progress, first)

    def step_begin(self, step: int) -> None:
        self.hf.step_begin(step)

    def update_end(self, step: int, stats: Any) -> Any:
        """After each optimizer update of step `step`; returns that update's `stats` unchanged."""
        self.hf.update_end(step)
        return stats

    def request_stop(self) -> None:
        self.stop_requested = True

    def take_request(self, flag: str) -> bool:
        """A Hugging Face callback's ``control.should_save`` / ``should_evaluate`` ("save" / "evaluate")
        since the last call; clears it."""
        return self.hf.take(flag)

    def want_eval_set(self) -> bool:
        """Hugging Face callbacks are present, so ``control.should_evaluate`` may ask for the eval set."""
        return bool(self.hf.callbacks)

    def _call(self, hook: str, *args: Any) -> list[Any]:
        return [getattr(cb, hook)(*args) for cb in self.callbacks if callable(getattr(cb, hook, None))]

    def step_end(self, step: int, metrics: dict[str, Any]) -> bool:
        """Call every on_step_end; True when any asked to stop (or a stop was requested)."""
        answers = self._call("on_step_end", step, dict(metrics))
        if any(a is True or a == "stop" for a in answers):
            self.stop_requested = True
        return self.stop_requested

    def alert(self, findings: list) -> None:
        for finding in findings:
            self._call("on_alert", finding)

    def checkpoint(self, path: Path) -> None:
        self._call("on_checkpoint", path)

    def train_end(self, result: Any) -> None:
        self._call("on_train_end", result)
