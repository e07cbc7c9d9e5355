"""Hugging Face ``TrainerCallback`` objects (what TRL's GRPOTrainer takes in ``callbacks=``) as grpo callbacks.

A ``transformers.TrainerCallback`` is called as Hugging Face's Trainer calls it, ``hook(args, state, control,
**kwargs)``:

* at the end of each step: ``on_step_end``, then ``on_log`` with ``logs`` = the step's metrics (every step is
  logged here); ``state.global_step`` is the step, ``state.log_history`` grows by its record;
* after a checkpoint: ``on_save``; once at the end: ``on_train_end`` (``model=`` and ``tokenizer=`` given).

``control.should_training_stop`` set by any hook stops the run after the step, with a checkpoint, as a grpo
callback returning True does. ``args`` carries the run's settings under Hugging Face's names (``output_dir``,
``max_steps``, ``learning_rate``, ``seed``, ``save_steps``, ``logging_steps`` = 1). ``on_train_begin`` runs
before the first step's hooks.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any


def is_hf_callback(cb: Any) -> bool:
    """A transformers.TrainerCallback (instance or class)."""
    try:
        from transformers import TrainerCallback
    except ImportError:            # transformers is a dependency; keep the check harmless anyway
        return False
    return isinstance(cb, TrainerCallback) or (isinstance(cb, type) and issubclass(cb, TrainerCallback))


class HFCallback:
    """One TrainerCallback behind grpo's callback protocol (grpo/training/callbacks.py)."""

    def __init__(self, callback: Any, cfg: Any = None):
        from transformers import TrainerControl, TrainerState

        self.callback = callback() if isinstance(callback, type) else callback
        tc = getattr(cfg, "train", None)
        self.args = SimpleNamespace(
            output_dir=str(getattr(tc, "output_dir", "")), max_steps=getattr(tc, "max_steps", 0),
            seed=getattr(tc, "seed", 0), save_steps=getattr(tc, "save_steps", 0), logging_steps=1,
            learning_rate=getattr(getattr(cfg, "optim", None), "lr", 0.0), report_to=[])
        self.state = TrainerState(max_steps=self.args.max_steps, logging_steps=1, save_steps=self.args.save_steps)
        self.control = TrainerControl()
        self.begun = False

    def _hook(self, name: str, **kwargs: Any) -> None:
        result = getattr(self.callback, name)(self.args, self.state, self.control, **kwargs)
        if result is not None:                   # Hugging Face's Trainer takes a returned control object
            self.control = result

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> bool:
        if not self.begun:
            self.begun = True
            self._hook("on_train_begin")
        self.state.global_step = step
        self.state.log_history.append({**metrics, "step": step})
        self._hook("on_step_end")
        self._hook("on_log", logs=dict(metrics))
        return bool(self.control.should_training_stop)

    def on_checkpoint(self, path: Path) -> None:
        self._hook("on_save")

    def on_train_end(self, result: Any) -> None:
        self._hook("on_train_end", model=getattr(result, "model", None), tokenizer=getattr(result, "tokenizer", None))
