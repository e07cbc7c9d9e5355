"""Running reward functions on a batch: concurrency, value checks, error handling, the weighted sum.

Reward functions are called **by keyword**, exactly as TRL's GRPOTrainer calls them::

    fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)

so ``def accuracy(completions, solution, **kwargs)`` works unchanged. ``completions`` holds strings,
or for a conversational prompt (a list of chat messages) ``[{"role": "assistant", "content": text}]``
(grpo/rewards/text.py ``chat_completions``); ``columns`` are every other dataset column, one value
per completion (``completion_ids`` is one of them when the caller has token ids). A function whose
parameters cannot take these keywords (no ``**kwargs`` and a column it does not name, or a
required parameter that is not passed) is an error in both ``on_error`` modes, with a hint.

Every function of one scoring call is called once on the whole batch. Plain functions run one
after the other; ``async def`` functions (anything returning an awaitable) are then awaited
*concurrently*, all in one event loop (``asyncio.gather``). When the caller is itself inside a
running event loop (a notebook), that loop is left alone and the gather runs in a helper thread.

User code is contained: each function gets its own copy of ``prompts``, ``completions`` and every
column list (mutating them changes nothing another function or the trainer sees); whatever it
raises, ``SystemExit`` and other ``BaseException`` included (only ``KeyboardInterrupt`` passes
through), is an error of that function; its output must be a list or tuple (or a 1-D array or
tensor), never a dict, set, string or generator. ``timeout_s`` > 0 (``reward.timeout_s``) bounds
every call: a sync function then runs in a daemon worker thread, which is abandoned if it does not
return in time (Python cannot stop a thread); awaitables are cancelled; a coroutine that blocks its
event loop is given up after ``timeout_s`` + :data:`LOOP_GRACE_S`. A timed-out call is an error of
the whole batch (the function is not called again sample by sample). ``timeout_s`` = 0 calls sync
functions in the calling thread, as TRL does (code that relies on ``signal.alarm``, e.g.
math-verify's own time limits, needs the main thread).

Errors (a function raises, times out, returns something that is not a list of one value per
completion, or a value that is not a finite number, NaN or None: NaN counts as None, "does not apply", as
in TRL; +-inf is an error) are handled by the ``on_error`` mode (``reward.reward_errors``):

* ``raise`` (default): a one-line :class:`RewardError` naming the function and the completion
  (index and a short excerpt; ``RewardError.index``). When the call on the whole batch raises, the
  function is called again once per completion to find the completions that fail; if none fails
  alone, the message says so.
* ``zero``: every failing value becomes 0.0 for that function. After a raising batch call, the
  completions that fail alone get 0.0 and the others their per-completion value; a batch-level
  failure (wrong number of values, or no completion fails alone) zeroes the whole batch.
  ``Scored.errors[name]`` counts the completions whose reward was replaced by 0.0, and one
  warning is logged per function and call.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpo.rewards.calling import (CALL_HINT, LOOP_GRACE_S, ArgumentMismatch, RewardFn,  # noqa: F401
                                  RewardError, RewardTimeout, _CALL_ERRORS, argument_problem, in_thread, own_copy, reward_kwargs,
                                  run_calls)
from grpo.algorithms.advantages import weighted_nansum
from grpo.rewards.context import unlogged
from grpo.rewards.text import as_text
from grpo.types import Scored

log = logging.getLogger(__name__)

Checker = Callable[[Any], "tuple[Any, str | None]"]
#: Values of ``reward.reward_errors``.
REWARD_ERROR_MODES = ("raise", "zero")
#: Characters of a completion quoted in error messages.
EXCERPT_CHARS = 60
#: Names of the functions already warned about for returning None on a whole batch (warned once each).
_WARNED_NO_SIGNAL: set[str] = set()


@dataclass
class Failure:
    """One error of a reward function: on completion ``index``, or on the whole batch (None).
    ``fatal``: raised even with ``on_error="zero"`` (the function cannot take its arguments)."""

    index: int | None
    message: str
    fatal: bool = False


def row_columns(columns: dict[str, list], i: int) -> dict[str, list]:
    """The columns of completion i alone: {k: [v[i]]}."""
    return {k: [v[i]] for k, v in columns.items()}


# ---------------------------------------------------------------- messages


def excerpt(completion: Any, width: int = EXCERPT_CHARS) -> str:
    """A short quoted start of a completion for error messages (newlines escaped)."""
    try:
        text = as_text(completion)          # chat messages: their content
    except TypeError:
        text = str(completion)
    return repr(text if len(text) <= width else text[:width - 3] + "...")


def describe(e: BaseException) -> str:
    """'KeyError: x' on one line (first line of the message, at most 200 characters)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def call_hint(e: BaseException) -> str:
    """'; <CALL_HINT>' when ``e`` is a TypeError about a call's arguments, else ''."""
    return f"; {CALL_HINT}" if isinstance(e, TypeError) and any(p in str(e) for p in _CALL_ERRORS) else ""


def _at(completions: list, i: int) -> str:
    return f"for completion {i} ({excerpt(completions[i])})"


# ---------------------------------------------------------------- checking the output of one function


def check_value(value: Any) -> tuple[float | None, str | None]:
    """A reward value as (float or None, None), or (None, why it is unusable). NaN is None ("does not
    apply"), as in TRL, whose nan-aware means treat both alike; +-inf has no such meaning (TRL's group
    mean and advantages would become inf or NaN) and is an error."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"returned {value!r}: expected a finite number, NaN or None"
    if math.isnan(float(value)):
        return None, None
    if math.isinf(float(value)):
        return None, f"returned {float(value)!r}: expected a finite number, NaN or None"
    return float(value), None


def unchecked(value: Any) -> tuple[Any, None]:
    """Any value is fine (callers check it themselves, e.g. per-step reward lists)."""
    return value, None


def as_values(out: Any) -> list | None:
    """A function's output as a list: a list, tuple or other sequence, or a 1-D numpy array or torch
    tensor; None for anything else (a dict would be read by its keys, a set in no order, a string by
    its characters, a generator at most once)."""
    if isinstance(out, Sequence) and not isinstance(out, (str, bytes, bytearray)):
        return list(out)
    if type(out).__name__ in ("ndarray", "Tensor") and getattr(out, "ndim", None) == 1:
        return out.tolist()
    return None


def shape_problem(out: Any, n: int) -> tuple[list | None, str | None]:
    """(``out`` as a list of n values, None), or (None, why it is not one)."""
    values = as_values(out)
    if values is None:
        got = "None" if out is None else f"a {type(out).__name__}"
        return None, f"must return a list of one value per completion ({n}), got {got}"
    if len(values) != n:
        return None, f"must return one value per completion ({n}), got {len(values)}"
    return values, None


def check_output(name: str, out: Any, completions: list, check: Checker = check_value) -> tuple[list, list[Failure]]:
    """A batch output (not an exception) as one checked value per completion, and the failures."""
    out, problem = shape_problem(out, len(completions))
    if problem:
        return [None] * len(completions), [Failure(None, f"reward function '{name}' {problem}")]
    values, failures = [], []
    for i, raw in enumerate(out):
        value, problem = check(raw)
        if problem:
            failures.append(Failure(i, f"reward function '{name}' {problem} {_at(completions, i)}"))
        values.append(value)
    return values, failures


def locate(name: str, fn: RewardFn, prompts: list, completions: list, columns: dict[str, list],
           check: Checker = check_value, timeout_s: float = 0.0) -> tuple[list, list[Failure]]:
    """After a batch call raised: call ``fn`` once per completion (async ones concurrently).

    Returns the per-completion values and one failure per completion that fails alone.
    """
    with unlogged():                     # the batch call's log_metric / log_extra stand; these calls log nothing
        outs = run_calls([(fn, [prompts[i]], [completions[i]], row_columns(columns, i))
                          for i in range(len(completions))], timeout_s)
    values, failures = [], []
    for i, out in enumerate(outs):
        value, problem, hint = None, None, ""
        if isinstance(out, RewardTimeout):
            problem = str(out)
        elif isinstance(out, BaseException):
            problem, hint = f"raised {describe(out)}", call_hint(out)
        else:
            out, problem = shape_problem(out, 1)
            if problem is None:
                value, problem = check(out[0])
        if problem:
            failures.append(Failure(i, f"reward function '{name}' {problem} {_at(completions, i)}{hint}"))
        values.append(value)
    return values, failures


def report(failures: list[Failure]) -> str:
    """One line: the first failure, plus how many more completions failed."""
    more = f" (and {len(failures) - 1} more completions)" if len(failures) > 1 else ""
    return failures[0].message + more


def find_failures(name: str, fn: RewardFn, out: Any, prompts: list, completions: list,
                  columns: dict[str, list], check: Checker = check_value,
                  timeout_s: float = 0.0) -> tuple[list, list[Failure]]:
    """Checked values of one function's batch output and its failures; when the batch call raised,
    the failing completions are located by calling the function once per completion."""
    if not isinstance(out, BaseException):
        return check_output(name, out, completions, check)
    if isinstance(out, ArgumentMismatch):   # every call would fail alike: no per-completion search
        return [None] * len(completions), [Failure(None, f"reward function '{name}' {out}", fatal=True)]
    if isinstance(out, RewardTimeout):      # a search could take a timeout per completion: the batch fails
        return [None] * len(completions), [Failure(None, f"reward function '{name}' {out} on the batch of "
                                                         f"{len(completions)} completions")]
    values, failures = locate(name, fn, prompts, completions, columns, check, timeout_s)
    if not failures:
        failures = [Failure(None, f"reward function '{name}' raised {describe(out)} on the batch of "
                                  f"{len(completions)} completions, but no single completion fails alone"
                                  f"{call_hint(out)}")]
    return values, failures


def resolve(name: str, fn: RewardFn, out: Any, prompts: list, completions: list, columns: dict[str, list],
            on_error: str, timeout_s: float = 0.0) -> tuple[list, int]:
    """Checked values of one function for the batch and how many were zeroed (``on_error`` = zero).

    ``raise`` mode raises a one-line RewardError on the first failure, and so does ``zero`` mode
    when the function cannot take its arguments.
    """
    values, failures = find_failures(name, fn, out, prompts, completions, columns, timeout_s=timeout_s)
    if not failures:
        return values, 0
    if on_error == "raise" or any(f.fatal for f in failures):
        raise RewardError(report(failures), failures[0].index)
    log.warning("%s; counted as 0.0 (reward.reward_errors=zero)", report(failures))
    if any(f.index is None for f in failures):    # a batch-level failure: the whole batch is zeroed
        return [0.0] * len(completions), len(completions)
    for f in failures:
        values[f.index] = 0.0
    return values, len(failures)


# ---------------------------------------------------------------- scoring


def unfed_parameters(fn: RewardFn, argument_names: list[str]) -> list[str]:
    """`fn`'s named parameters with a default that no argument of the call filled: the columns it reads when
    the dataset has them (``answer=None``, ``solution=None``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.default is not p.empty and p.name not in argument_names]


def warn_no_signal(name: str, values: list, argument_names: list[str], fn: RewardFn | None = None) -> None:
    """Warn once per function name when it returned None for every completion of a batch, naming the
    parameters of `fn` that got no column."""
    if not values or any(v is not None for v in values) or name in _WARNED_NO_SIGNAL:
        return
    _WARNED_NO_SIGNAL.add(name)
    unfed = unfed_parameters(fn, argument_names) if fn is not None else []
    need = f"; it reads a column {' or '.join(repr(n) for n in unfed)}, which the data does not have" if unfed else ""
    log.warning("warning: reward function '%s' returned None for all %d completions of a batch: it applies to "
                "none of them and gives no learning signal (does it get the columns it needs? it was called with "
                "%s%s)", name, len(values), ", ".join(argument_names), need)


def score(functions: list[tuple[str, RewardFn]], weights: list[float] | None, prompts: list,
          completions: list, columns: dict[str, list], on_error: str = "raise", timeout_s: float = 0.0,
          combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> Scored:
    """Run every reward function and combine them into the one total of the step.

    `combine(per_function [N, R], weights [R]) -> total [N]` (grpo.algorithms.advantages.REWARD_COMBINERS,
    ``algorithm.reward_combination``, with the group size bound); default: the weighted sum
    total_i = sum_k w_k r_ik over the k with r_ik not None (sum_then_normalize).

    A completion for which every function returned None gets total NaN ("no reward"; the advantage
    estimators give it advantage 0). ``Scored.errors`` maps every function name to the number of
    completions whose reward became 0.0 because of an error (always 0 with ``on_error="raise"``).
    ``timeout_s`` > 0 bounds every call (``reward.timeout_s``; see the module docstring).

    Shape: N completions -> per_function [N, R] (NaN = None), total [N]
    """
    if on_error not in REWARD_ERROR_MODES:
        raise RewardError(f"reward_errors must be one of {' | '.join(REWARD_ERROR_MODES)}, got '{on_error}'")
    weights = weights or [1.0] * len(functions)
    outs = run_calls([(fn, prompts, completions, columns) for _, fn in functions], timeout_s)
    table = torch.full((len(completions), len(functions)), float("nan"), device="cpu")   # host-side, as the rewards
    errors: dict[str, int] = {}
    for k, ((name, fn), out) in enumerate(zip(functions, outs)):
        values, count = resolve(name, fn, out, prompts, completions, columns, on_error, timeout_s)
        warn_no_signal(name, values, ["prompts", "completions", *columns], fn)
        errors[name] = errors.get(name, 0) + count          # a name listed twice: counts add up
        table[:, k] = torch.tensor([float("nan") if v is None else v for v in values], dtype=torch.float32,
                                   device=table.device)
    w = torch.tensor(weights, dtype=torch.float32, device=table.device)     # [R]
    total = (combine or weighted_nansum)(table, w)                          # [N] NaN: no function applied
    return Scored(names=[n for n, _ in functions], per_function=table, total=total, errors=errors)


def call_one(name: str, fn: RewardFn, prompts: list, completions: list, columns: dict[str, list],
             timeout_s: float = 0.0) -> list:
    """One function's output, one unchecked entry per completion (e.g. per-step reward lists);
    errors are one-line RewardErrors naming the function and, when found, the completion."""
    out = run_calls([(fn, prompts, completions, columns)], timeout_s)[0]
    values, failures = find_failures(name, fn, out, prompts, completions, columns, unchecked, timeout_s)
    if failures:
        raise RewardError(report(failures), failures[0].index)
    return values
