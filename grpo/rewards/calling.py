"""Calling reward functions: TRL's keyword call, containment of user code, sync calls then async ones
concurrently, and the time limit (``reward.timeout_s``). grpo.rewards.scoring checks what they return.

Reward functions are called **by keyword**, exactly as TRL's GRPOTrainer calls them::

    fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)

plus TRL's ``trainer_state``, ``log_metric`` and ``log_extra`` for a function that takes them
(grpo/rewards/context.py). Every function of one scoring call is called once on the whole batch.
Plain functions run one after the other; ``async def`` functions (anything returning an awaitable) are then awaited
*concurrently*, all in one event loop (``asyncio.gather``). When the caller is itself inside a
running event loop (a notebook), that loop is left alone and the gather runs in a helper thread.
Each function gets its own copy of every argument list; ``timeout_s`` > 0 runs a sync function in a
daemon worker thread that is abandoned if it does not return in time, and cancels awaitables.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from grpo.rewards.context import CONTEXT_KEYWORDS, context_kwargs

RewardFn = Callable[..., Any]
#: With a timeout, extra seconds given to the event loop of the async functions to wind down.
LOOP_GRACE_S = 1.0
#: Values that need no copy (immutable).
_ATOMS = frozenset({str, int, float, bool, bytes, complex, type(None)})


class RewardError(ValueError):
    """A reward function that cannot be loaded or returned something unusable (one-line message).

    ``index`` is the completion the error is about (None: the whole batch, or no completion).
    """

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class ArgumentMismatch(Exception):
    """A reward function's parameters cannot take the keyword arguments of the call (not called)."""


class RewardTimeout(Exception):
    """A reward call that did not return within ``reward.timeout_s`` (its message follows the name)."""

    def __init__(self, timeout_s: float):
        super().__init__(f"did not return within reward.timeout_s={timeout_s:g} s")


#: Appended to errors caused by a reward function's signature.
CALL_HINT = ("reward functions are called by keyword as in TRL: fn(prompts=, completions=, completion_ids=, "
             "**columns); add **kwargs")
#: Phrases of Python's TypeError for a call whose arguments do not fit the signature.
_CALL_ERRORS = ("unexpected keyword argument", "multiple values for argument", "required positional argument",
                "required keyword-only argument", "positional-only")


# ---------------------------------------------------------------- calling (sync, then async concurrently)


def reward_kwargs(prompts: list, completions: list, columns: dict[str, list]) -> dict[str, list]:
    """The keyword arguments of a reward call: ``prompts``, ``completions`` and every column."""
    clash = next((k for k in ("prompts", "completions", *CONTEXT_KEYWORDS) if k in columns), None)
    if clash:
        raise RewardError(f"a column is named '{clash}', like a reward function argument: rename it "
                          "(data.column_map)")
    return {"prompts": prompts, "completions": completions, **columns}


def argument_problem(fn: RewardFn, kwargs: dict[str, Any]) -> str | None:
    """Why ``fn(**kwargs)`` does not fit ``fn``'s signature (None: it fits, or there is no signature).
    A decorator's own signature is used, not the wrapped function's: the call decides for wrappers."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):  # builtins and some C callables have none: let the call decide
        return None
    try:
        signature.bind(**kwargs)
    except TypeError as e:
        return str(e)
    return None


def own_copy(value: Any) -> Any:
    """A copy of a reward argument that shares nothing mutable with ``value`` (lists, tuples and dicts
    copied level by level, fast for flat lists of numbers or strings; other objects deep-copied)."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind in (list, tuple):
        if _ATOMS.issuperset(map(type, value)):         # e.g. completion ids: one C-level pass
            return kind(value)
        return kind(own_copy(v) for v in value)
    if kind is dict:
        return {k: own_copy(v) for k, v in value.items()}
    return copy.deepcopy(value)


def _call_contained(fn: RewardFn, kwargs: dict[str, Any]) -> Any:
    """``fn(**kwargs)`` or whatever it raised, SystemExit included (only KeyboardInterrupt passes)."""
    try:
        return fn(**kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a user's function: reported with its name by the caller
        return e


def in_thread(call: Callable[[], Any], timeout_s: float) -> Any:
    """``call()`` in a daemon thread: its result, the exception it raised, or :class:`RewardTimeout`
    when it has not returned after ``timeout_s`` (the thread is then abandoned: Python cannot stop it;
    being a daemon it does not keep the process alive). Signal handlers keep running meanwhile."""
    box: list = []

    def target() -> None:
        try:
            box.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the caller as a value
            box.append(e)

    thread = threading.Thread(target=target, name="grpo-reward", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else RewardTimeout(timeout_s)


def _start(fn: RewardFn, prompts: list, completions: list, columns: dict[str, list], timeout_s: float = 0.0) -> Any:
    """``fn(prompts=, completions=, **columns)`` on its own copies of the arguments: its result,
    awaitable, or the exception it raised (an :class:`ArgumentMismatch`, without calling it, when its
    parameters cannot take the keywords; a :class:`RewardTimeout` when ``timeout_s`` > 0 ran out)."""
    batch = reward_kwargs(own_copy(prompts), own_copy(completions), {k: own_copy(v) for k, v in columns.items()})
    kwargs = {**batch, **context_kwargs(fn)}   # + TRL's trainer_state, log_metric, log_extra it takes (context.py)
    problem = argument_problem(fn, kwargs)
    if problem:
        return ArgumentMismatch(f"cannot take its arguments: {problem} (called with {', '.join(batch)}); "
                                f"{CALL_HINT}")
    if timeout_s > 0:
        return in_thread(lambda: _call_contained(fn, kwargs), timeout_s)
    return _call_contained(fn, kwargs)


async def _contained(awaitable: Any) -> Any:
    """The awaitable's result or whatever it raised (cancellation and KeyboardInterrupt pass through)."""
    try:
        return await awaitable
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit would otherwise stop the event loop
        return e


async def _settle(awaitable: Any, timeout_s: float) -> Any:
    """The awaitable's result, what it raised, or RewardTimeout after ``timeout_s`` (0 = no limit)."""
    task = asyncio.ensure_future(_contained(awaitable))
    done, _ = await asyncio.wait({task}, timeout=timeout_s or None)
    if not done:
        task.cancel()
        return RewardTimeout(timeout_s)
    return asyncio.CancelledError("the reward's task was cancelled") if task.cancelled() else task.result()


async def _settle_all(awaitables: list, timeout_s: float, results: list) -> None:
    """Await all concurrently; results[i] gets each one's outcome as soon as it has one."""
    async def one(i: int, awaitable: Any) -> None:
        results[i] = await _settle(awaitable, timeout_s)

    await asyncio.gather(*(one(i, a) for i, a in enumerate(awaitables)))


def _await_all(awaitables: list, timeout_s: float = 0.0) -> list:
    """Outcomes of the awaitables, run concurrently in one event loop (exceptions returned as values).

    With ``timeout_s`` > 0 the loop runs in a daemon thread given ``timeout_s`` + LOOP_GRACE_S, so a
    coroutine that blocks its loop (no await) cannot hold the run either: what has not finished then
    is a RewardTimeout."""
    results: list = [RewardTimeout(timeout_s)] * len(awaitables)

    def run() -> None:
        asyncio.run(_settle_all(awaitables, timeout_s, results))

    if timeout_s > 0:
        failed = in_thread(run, timeout_s + LOOP_GRACE_S)
        if isinstance(failed, BaseException) and not isinstance(failed, RewardTimeout):
            raise failed
        return list(results)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        run()
        return results
    with ThreadPoolExecutor(max_workers=1) as pool:  # inside a running loop: use a fresh one elsewhere
        pool.submit(run).result()
    return results


def run_calls(calls: list[tuple[RewardFn, list, list, dict[str, list]]], timeout_s: float = 0.0) -> list:
    """Run every ``(fn, prompts, completions, columns)`` call by keyword; async ones concurrently.

    Returns one entry per call: the function's output or the exception it raised (a RewardTimeout
    when ``timeout_s`` > 0 ran out).
    """
    results = [_start(*call, timeout_s) for call in calls]
    pending = [i for i, r in enumerate(results) if inspect.isawaitable(r)]
    if pending:
        for i, value in zip(pending, _await_all([results[i] for i in pending], timeout_s)):
            results[i] = value
    return results
