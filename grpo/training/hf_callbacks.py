"""Hugging Face ``TrainerCallback`` objects (what TRL's GRPOTrainer takes in ``callbacks=``), called as
transformers' Trainer calls them: ``hook(args, state, control, model=, processing_class=, optimizer=,
lr_scheduler=, train_dataloader=None, eval_dataloader=None, **event)``.

All of a run's TrainerCallbacks share one ``args``, ``state`` (a ``transformers.TrainerState``) and
``control``, as under transformers' CallbackHandler. Steps count optimizer updates, as in TRL
(grpo/training/trl_view.py). A grpo step is one generation batch with U = ``algorithm.updates_per_step``
updates, so it counts as U Hugging Face steps. The hooks come in transformers' order:

* ``on_init_end`` when ``grpo.Trainer(...)`` is built; ``on_train_begin`` and ``on_epoch_begin`` before the
  first step;
* for each optimizer update: ``on_step_begin`` (the first one before the step's rollout), then
  ``on_substep_end`` (gradient_accumulation_steps - 1 times), ``on_pre_optimizer_step`` and ``on_optimizer_step``. Then
  ``global_step`` is incremented and ``on_step_end`` is called. These hooks are called once the update has
  run: the micro-batches are inside grpo/training/update.py, so ``on_substep_end`` cannot come between them;
* once per grpo step, after its metrics are written: ``on_log`` with ``logs`` holding grpo's keys plus TRL's
  names (``loss``, ``reward``, ``rewards/<fn>/mean``, ``kl``, ``learning_rate``, ``grad_norm``, ``epoch``,
  ...; ``state.log_history`` gets the same entry plus ``step``); then ``on_evaluate(metrics=)`` after a
  held-out evaluation (``train.eval_steps``); then ``on_save`` after a checkpoint;
* ``on_epoch_end`` / ``on_epoch_begin`` when a step starts in a new epoch (prompts drawn / prompts); at the
  end ``on_epoch_end`` for the last epoch, ``on_log`` with TRL's summary (``train_loss``, ``train_runtime``,
  ...) and ``on_train_end``.

``on_pre_optimizer_step`` is called from a step pre-hook on the run's optimizer
(``optimizer.register_step_pre_hook``): after the gradients are clipped, just before ``optimizer.step()``, as in
transformers, with the gradients there to read (a step skipped for non-finite gradients makes no call).
``control.should_training_stop`` stops the run at the end of the current grpo step, with a checkpoint, as
a grpo callback returning True does. ``control.should_save`` set by any hook during a grpo step writes a
checkpoint at its end (then ``on_save``), whatever ``train.save_steps`` says. ``control.should_evaluate``
runs the held-out evaluation after the step's updates (its ``eval_`` metrics in that step's ``on_log``, then
``on_evaluate``) when the run has an eval set (``eval_dataset`` / ``data.eval_dataset``); one set in
``on_log`` or later is taken at the next step. As under transformers, ``on_step_begin`` clears the flags, but
a request made earlier in the same grpo step is kept until the loop acts on it. ``should_log`` (every step is
logged) and ``should_epoch_stop`` are not read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from grpo.training.trl_view import TrlProgress, training_arguments

#: The TrainerCallback methods this module calls.
HOOKS = ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_substep_end",
         "on_pre_optimizer_step", "on_optimizer_step",
         "on_step_end", "on_log", "on_evaluate", "on_save", "on_epoch_end", "on_train_end")


def is_hf_callback(cb: Any) -> bool:
    """A transformers.TrainerCallback (instance or class)."""
    try:
        from transformers import TrainerCallback
    except ImportError:            # transformers is a dependency; keep the check harmless anyway
        return False
    return isinstance(cb, TrainerCallback) or (isinstance(cb, type) and issubclass(cb, TrainerCallback))


class HFCallbacks:
    """A run's TrainerCallbacks behind grpo's callback protocol (grpo/training/callbacks.py).

    The loop calls ``train_begin``, ``step_begin`` and ``update_end``. grpo's protocol calls
    ``on_step_end``, ``on_checkpoint`` and ``on_train_end``. ``add`` / ``pop`` / ``remove`` work as
    transformers' ``add_callback`` / ``pop_callback`` / ``remove_callback``.
    """

    def __init__(self, callbacks: list | tuple = (), cfg: Any = None):
        from transformers import TrainerControl, TrainerState

        self.callbacks: list[Any] = []
        for cb in callbacks:
            self.add(cb)
        self.progress: TrlProgress | None = None
        self.args = training_arguments(cfg) if cfg is not None else None
        a = self.args
        self.state = TrainerState(max_steps=a.max_steps if a else 0, logging_steps=a.logging_steps if a else 1,
                                  save_steps=a.save_steps if a else 0, eval_steps=a.eval_steps if a else 0,
                                  train_batch_size=a.per_device_train_batch_size if a else None)
        self.control = TrainerControl()
        self.pre_step = None                 # the optimizer's step pre-hook handle (on_pre_optimizer_step)
        self.substeps_done = False           # this update's on_substep_end calls made (by the pre-hook)
        self.objects: dict[str, Any] = {"model": None, "processing_class": None, "optimizer": None,
                                        "lr_scheduler": None, "train_dataloader": None, "eval_dataloader": None}
        self.begun = False
        self.epoch_index = 0            # the epoch the last on_epoch_begin opened
        self.epoch_open = False
        self.updates = 0
        self.wanted: set[str] = set()    # "save" / "evaluate": control flags set since the loop last took them

    # ------------------------------------------------------------ the list (transformers' CallbackHandler)

    def add(self, callback: Any) -> None:
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def pop(self, callback: Any) -> Any:
        """Remove and return `callback` (an instance, or the first instance of a class); None when absent."""
        for cb in self.callbacks:
            if (isinstance(cb, callback) if isinstance(callback, type) else cb == callback):
                self.callbacks.remove(cb)
                return cb
        return None

    def remove(self, callback: Any) -> None:
        if self.pop(callback) is None and not isinstance(callback, type):
            raise ValueError(f"remove_callback: {type(callback).__name__} is not one of the trainer's callbacks")

    def event(self, name: str, **kwargs: Any) -> None:
        """Call hook `name` of every callback, in order; a returned control object replaces ours."""
        for cb in self.callbacks:
            result = getattr(cb, name)(self.args, self.state, self.control, **self.objects, **kwargs)
            if result is not None:
                self.control = result

    # ------------------------------------------------------------ called by the Trainer and the loop

    def init_end(self, model: Any, tokenizer: Any) -> None:
        self.objects.update(model=model, processing_class=tokenizer)
        self.event("on_init_end")

    def train_begin(self, state: Any, progress: TrlProgress, first: int) -> None:
        """Before grpo step `first` (a resumed run: after its checkpoint). `state` is the loop's TrainState."""
        self.progress, self.args, self.begun = progress, progress.args, True
        self.objects.update(model=state.model, processing_class=state.tokenizer, optimizer=state.optimizer,
                            lr_scheduler=state.scheduler)
        if self.pre_step is not None:
            self.pre_step.remove()
        self.pre_step = state.optimizer.register_step_pre_hook(   # the gradients are clipped, not yet applied
            lambda optimizer, args, kwargs: self._before_optimizer_step())
        s = self.state
        s.global_step, s.epoch = progress.global_step(first - 1), progress.epoch(first - 1)
        s.max_steps, s.num_train_epochs, s.log_history = progress.max_steps, progress.num_train_epochs, progress.log_history
        s.logging_steps, s.save_steps, s.eval_steps = self.args.logging_steps, self.args.save_steps, self.args.eval_steps
        s.train_batch_size = self.args.per_device_train_batch_size
        s.is_world_process_zero = s.is_local_process_zero = progress.is_main
        self.control.should_training_stop = False
        self.event("on_train_begin")
        self.epoch_index = math.floor(s.epoch)
        self._epoch_begin()

    def step_begin(self, step: int) -> None:
        """Before grpo step `step`'s rollout: a new epoch if one began, then the first update's on_step_begin."""
        if self.progress is None:
            return
        self.updates = 0                               # optimizer updates of this grpo step so far
        epoch = math.floor(self.progress.epoch(step - 1))
        if epoch > self.epoch_index:
            self._epoch_end()
            self.epoch_index = epoch
            self._epoch_begin()
        self._step_begin()

    def update_end(self, step: int) -> None:
        """After the next optimizer update of grpo step `step`."""
        if self.progress is None:
            return
        u, p = self.progress.updates_per_step, self.progress
        self.updates, index = self.updates + 1, self.updates + 1
        if not self.substeps_done:                     # a skipped (non-finite) step: no optimizer.step() call
            self._substeps()
        self.substeps_done = False
        self.event("on_optimizer_step")
        self.state.global_step = p.global_step(step - 1) + index
        self.state.epoch = p.epoch(step - 1) + (p.epoch(step) - p.epoch(step - 1)) * index / u
        self.event("on_step_end")
        if index < u:                                  # the next update of this generation batch
            self._step_begin()

    # ------------------------------------------------------------ grpo's callback protocol

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> bool:
        if not self.begun:                             # a loop that does not call train_begin (grpo/flow)
            self.begun = True
            self.event("on_train_begin")
        if self.progress is None:
            entry = {**metrics, "step": step}
            self.state.global_step = step
            self.state.log_history.append(entry)
        else:
            entry = self.progress.last                # the loop's progress.log(record) of this step
            self.state.global_step, self.state.epoch = entry["step"], entry["epoch"]
        self.event("on_log", logs={k: v for k, v in entry.items() if k != "step"})
        evaluated = {k: v for k, v in entry.items() if k.startswith("eval_")}
        if evaluated:
            self.event("on_evaluate", metrics={**evaluated, "epoch": entry.get("epoch", 0.0)})
        return bool(self.control.should_training_stop)

    def on_checkpoint(self, path: Path) -> None:
        self.control.should_save = False
        self.wanted.discard("save")
        self.event("on_save")

    def take(self, flag: str) -> bool:
        """Whether ``control.should_<flag>`` ("save" / "evaluate") was set since the last take; clears it."""
        self._keep_requests()
        hit = flag in self.wanted
        self.wanted.discard(flag)
        setattr(self.control, f"should_{flag}", False)
        return hit

    def on_train_end(self, result: Any) -> None:
        if self.epoch_open:
            self._epoch_end()
        if self.progress is not None:                  # TRL's last log: the training summary
            logs = self.progress.train_metrics(result.steps, result.wall_s)
            self.state.log_history.append({**logs, "step": self.state.global_step})
            self.event("on_log", logs=logs)
        self.objects["model"] = getattr(result, "model", None) or self.objects["model"]
        if self.pre_step is not None:
            self.pre_step.remove()
            self.pre_step = None
        self.event("on_train_end")

    # ------------------------------------------------------------

    def _substeps(self) -> None:
        for _ in range(self.args.gradient_accumulation_steps - 1):
            self.event("on_substep_end")
        self.substeps_done = True

    def _before_optimizer_step(self) -> None:
        """The optimizer's step pre-hook: transformers' on_substep_end calls, then on_pre_optimizer_step."""
        if self.progress is None:
            return
        self._substeps()
        self.event("on_pre_optimizer_step")

    def _keep_requests(self) -> None:
        self.wanted |= {f for f in ("save", "evaluate") if getattr(self.control, f"should_{f}", False)}

    def _step_begin(self) -> None:
        self._keep_requests()                          # a request of this grpo step's earlier updates stands
        self.control.should_log = self.control.should_evaluate = self.control.should_save = False
        self.event("on_step_begin")

    def _epoch_begin(self) -> None:
        self.control.should_epoch_stop, self.epoch_open = False, True
        self.event("on_epoch_begin")

    def _epoch_end(self) -> None:
        self.epoch_open = False
        self.event("on_epoch_end")
