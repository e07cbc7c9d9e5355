"""What a reward call gets besides the batch: TRL's ``trainer_state``, ``log_metric`` and ``log_extra``.

TRL's GRPOTrainer passes three keywords to every reward function beside the columns (a function that
names them, or takes ``**kwargs``, gets them here too; one that does neither is called without them):

* ``trainer_state``: the training progress, read by curriculum rewards (``trainer_state.global_step /
  trainer_state.max_steps``). Here a :class:`TrainerState` with the fields of ``transformers.TrainerState``
  that have a meaning here, counted as TRL counts them (grpo/training/trl_view.py): ``global_step`` (optimizer
  updates done before this batch: 0 while the first step's completions are scored, as in TRL; a grpo step
  does ``algorithm.updates_per_step`` of them), ``max_steps`` (the run's optimizer updates), ``epoch``
  (prompts drawn before this batch over the train set's prompts), ``num_train_epochs``, ``log_history``
  (the steps logged so far, with TRL's key names), ``logging_steps``, ``save_steps``, ``eval_steps``,
  ``train_batch_size`` and ``is_world_process_zero`` / ``is_local_process_zero``.
* ``log_metric(name, value)``: a scalar of this step; the step's values are averaged and written to
  metrics.jsonl under ``name`` (``reward_log/<name>`` when ``name`` is one of the trainer's own keys).
* ``log_extra(column, values)``: one value per completion of the call, added to those completions'
  entries in samples.jsonl (``log.samples_per_step``) as ``extra[column]``. When the step's final batch is
  not the batch that was scored (dynamic sampling's or GFPO's reselection), the columns are left out and
  the step's record counts them in ``reward_log/extra_dropped``.

The trainer opens :func:`reward_context` around each step's scoring; outside it (``grpo eval``,
``grpo rewards check``, ``grpo sample``) rewards get ``TrainerState()`` (step 0 of 0) and their logs go
nowhere. A copy of the state is passed to each call, so a reward function cannot change the run's.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import math
import numbers
from contextlib import contextmanager
from typing import Any, Callable, Iterator

#: The keywords a context adds to a reward call, in TRL's names.
CONTEXT_KEYWORDS = ("trainer_state", "log_extra", "log_metric")


@dataclasses.dataclass
class TrainerState:
    """The training progress a reward function can read (the fields of transformers.TrainerState that have a
    meaning here; steps count optimizer updates, as TRL's do). grpo/training/trl_view.py fills it in."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    num_train_epochs: int = 0
    logging_steps: int = 1
    eval_steps: int = 0
    save_steps: int = 0
    train_batch_size: int | None = None
    log_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True


class RewardLog:
    """What reward functions logged during one step: scalar metrics and per-completion columns."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.extras: dict[str, list] = {}

    def log_metric(self, name: str, value: float) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"log_metric: the name must be a non-empty string, got {name!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise TypeError(f"log_metric('{name}', ...): the value must be a finite number, got {value!r}")
        self.values.setdefault(name, []).append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        if not isinstance(column, str) or not column:
            raise TypeError(f"log_extra: the column must be a non-empty string, got {column!r}")
        self.extras[column] = list(values)

    def finish(self, taken: set[str] | dict, count: int) -> tuple[dict[str, float], dict[str, list]]:
        """The step's metrics: the mean of each logged value, under its name (``reward_log/<name>`` when
        `taken` has it), with ``reward_log/extra_dropped`` when logged columns do not hold one value for
        each of the step's `count` completions; and the columns that do."""
        metrics = {(f"reward_log/{k}" if k in taken else k): sum(v) / len(v) for k, v in self.values.items()}
        kept = {k: v for k, v in self.extras.items() if len(v) == count}
        if len(kept) < len(self.extras):
            metrics["reward_log/extra_dropped"] = len(self.extras) - len(kept)
        return metrics, kept


_CURRENT: contextvars.ContextVar[tuple[TrainerState, RewardLog] | None] = contextvars.ContextVar(
    "grpo_reward_context", default=None)


@contextmanager
def reward_context(state: TrainerState) -> Iterator[RewardLog]:
    """Reward calls inside see `state` and log into the yielded RewardLog."""
    log = RewardLog()
    token = _CURRENT.set((state, log))
    try:
        yield log
    finally:
        _CURRENT.reset(token)


@contextmanager
def unlogged() -> Iterator[None]:
    """Reward calls inside see the current state, and what they log is dropped (per-completion re-calls)."""
    state = (_CURRENT.get() or (TrainerState(), None))[0]
    with reward_context(state):
        yield


def context_kwargs(fn: Callable[..., Any]) -> dict[str, Any]:
    """The context keywords `fn` can take (all with ``**kwargs``, else the ones it names), for one call."""
    try:
        params = inspect.signature(fn, follow_wrapped=False).parameters
    except (TypeError, ValueError):       # no signature (a builtin): pass nothing extra
        return {}
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    wanted = [k for k in CONTEXT_KEYWORDS if open_ended or k in params]
    if not wanted:
        return {}
    state, log = _CURRENT.get() or (TrainerState(), RewardLog())
    copy = dataclasses.replace(state, log_history=[dict(r) for r in state.log_history])   # the run's stays intact
    available = {"trainer_state": copy, "log_extra": log.log_extra, "log_metric": log.log_metric}
    return {k: available[k] for k in wanted}
