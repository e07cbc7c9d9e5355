"""verl's custom reward functions, used unchanged as grpo reward functions.

verl scores one response at a time with a function of four keyword arguments (verl docs,
"Implement Reward Function for Dataset", docs/preparation/reward_function.rst)::

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float

configured as ``custom_reward_function.path`` / ``custom_reward_function.name`` (default name
``compute_score``; "Config Explanation", docs/examples/config.rst). It may be ``async def`` and may return
a dict with a ``"score"`` key instead of a number ("Reward Loop", docs/advance/reward_loop.rst: "supports
both synchronous and asynchronous user-defined reward functions", ``return {"score": score}``). The other
keys of such a dict are kept per sample by verl's reward managers (``reward_extra_info``) and logged; verl's
docs do not describe that, its reward managers do it.

Its dataset rows (Parquet; "Prepare Data for Post-Training", docs/preparation/prepare_data.rst) have
``data_source`` (the dataset's name), ``prompt`` (a list of chat messages), ``ability``, ``reward_model``
(``{"style": "rule", "ground_truth": ...}``) and ``extra_info`` (a dict, e.g. ``{"split", "index"}``).
grpo loads such a file as it is: the messages go through the chat template, and every column reaches the
reward functions, the dict-valued ones as dicts.

:func:`from_verl` turns such a function into a grpo (TRL-style) batch reward function, called by keyword
with ``prompts``, ``completions`` and the dataset's columns (docs/rewards.md, "The protocol"). For each
completion it calls ``fn(data_source=, solution_str=, ground_truth=, extra_info=)`` with:

* ``data_source``: the row's ``data_source`` column (None without one);
* ``solution_str``: the completion's text (for a chat completion, the content of its messages), decoded
  with special tokens skipped, as verl decodes responses;
* ``ground_truth``: the row's ``reward_model["ground_truth"]``, else a ``ground_truth`` column; neither is a
  one-line error naming the function and both columns;
* ``extra_info``: the row's ``extra_info`` column, else None.

A function that names only some of the four gets only those (verl passes all four). The result, one per
completion: a number as the reward; a dict's ``"score"`` (a dict without one is an error naming the
function); None (or NaN) as "does not apply"; numpy / torch scalars as the Python values they hold. A
dict's other keys are logged: the batch mean of each numeric one (booleans count 0 / 1) through
``log_metric`` as ``reward_extra/<name>/<key>`` in metrics.jsonl, and every key whose values are JSON
scalars through ``log_extra`` as ``<name>/<key>`` beside each completion in samples.jsonl
(grpo/rewards/context.py). The reward keeps the function's ``__name__``.

:func:`adapt_reward` is the hook for loaders: it wraps a function whose signature is verl's
(:func:`is_verl_score_fn`) and returns anything else unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
from typing import Any, Callable

from grpo.rewards.calling import RewardError, RewardFn
from grpo.rewards.text import as_text

#: The keyword arguments verl passes to a custom reward function, in its order.
VERL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
#: The parameters that make a function verl-style (a TRL-style function names neither).
VERL_MARKERS = ("solution_str", "ground_truth")
#: Prefix of the metrics logged from the extra keys of dict results.
METRIC_PREFIX = "reward_extra"
#: Types of the values logged beside each completion (samples.jsonl is JSON).
_JSON_SCALARS = (str, int, float, bool, type(None))


def _parameters(fn: Any) -> dict[str, inspect.Parameter] | None:
    """``fn``'s parameters by name, or None when it is not callable or has no signature."""
    if not callable(fn):
        return None
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def is_verl_score_fn(fn: Any) -> bool:
    """True when ``fn`` has verl's reward signature: it names both ``solution_str`` and ``ground_truth``."""
    params = _parameters(fn)
    return params is not None and all(name in params for name in VERL_MARKERS)


def verl_name(fn: Any) -> str:
    """The reward name of ``fn``: its ``__name__`` (a functools.partial: the wrapped function's)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def accepted_arguments(fn: Any, name: str) -> tuple[str, ...]:
    """Which of VERL_ARGUMENTS ``fn`` takes (all four with ``**kwargs``); a RewardError naming the function
    when it requires an argument grpo does not pass (e.g. verl's GenRM ``reward_router_address``)."""
    params = _parameters(fn) or {}
    kinds = inspect.Parameter
    required = [p.name for p in params.values() if p.default is p.empty and p.name not in VERL_ARGUMENTS
                and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY, kinds.POSITIONAL_ONLY)]
    if required:
        raise RewardError(f"verl reward function '{name}' requires '{required[0]}', which grpo does not pass "
                          f"(it passes {', '.join(VERL_ARGUMENTS)})")
    if any(p.kind is kinds.VAR_KEYWORD for p in params.values()):
        return VERL_ARGUMENTS
    return tuple(a for a in VERL_ARGUMENTS if a in params)


def ground_truth_at(columns: dict[str, list], i: int, name: str) -> Any:
    """Row ``i``'s ground truth: ``reward_model[i]["ground_truth"]``, else ``ground_truth[i]``; neither is a
    one-line RewardError naming the function and the columns it looked for."""
    entry = columns["reward_model"][i] if "reward_model" in columns else None
    if isinstance(entry, dict) and "ground_truth" in entry:
        return entry["ground_truth"]
    if "ground_truth" in columns:
        return columns["ground_truth"][i]
    have = ", ".join(sorted(columns)) or "none"
    raise RewardError(f"verl reward function '{name}': completion {i} has no ground truth: the dataset needs a "
                      f"'reward_model' column holding {{'ground_truth': ...}} or a 'ground_truth' column "
                      f"(columns: {have})")


def verl_calls(completions: list, columns: dict[str, list], takes: tuple[str, ...], name: str) -> list[dict]:
    """The keyword arguments of ``fn`` for each completion (only the ones in ``takes``)."""
    calls = []
    for i, completion in enumerate(completions):
        values = {"data_source": columns["data_source"][i] if "data_source" in columns else None,
                  "solution_str": as_text(completion),
                  "ground_truth": ground_truth_at(columns, i, name),
                  "extra_info": columns["extra_info"][i] if "extra_info" in columns else None}
        calls.append({k: values[k] for k in takes})
    return calls


def plain(value: Any) -> Any:
    """A numpy scalar or a one-element torch tensor as the Python value it holds (``np.bool_(True)`` -> True);
    anything else as it is."""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if type(value).__name__ == "Tensor" and getattr(value, "numel", lambda: 0)() == 1:
        return value.item()
    return value


def split_result(result: Any, name: str) -> tuple[Any, dict[str, Any]]:
    """One verl result as (reward, extra values): a dict gives its ``"score"`` and its other keys; a bool
    becomes 0.0 / 1.0; numpy / torch scalars become Python numbers; anything else is the reward as it is
    (grpo's checks judge it)."""
    if isinstance(result, dict):
        if "score" not in result:
            raise RewardError(f"verl reward function '{name}' returned a dict without a 'score' key "
                              f"(keys: {', '.join(map(str, result)) or 'none'})")
        extras = {str(k): plain(v) for k, v in result.items() if k != "score"}
        return split_result(result["score"], name)[0], extras
    result = plain(result)
    return (float(result) if isinstance(result, bool) else result), {}


def _is_number(value: Any) -> bool:
    """A finite real number (bools count as 0 / 1)."""
    return isinstance(value, numbers.Real) and math.isfinite(float(value))


def extra_metrics(extras: list[dict[str, Any]], name: str) -> dict[str, float]:
    """``reward_extra/<name>/<key>`` -> the mean of the key's finite numeric values over the completions."""
    keys = dict.fromkeys(k for e in extras for k in e)
    out = {}
    for key in keys:
        values = [float(e[key]) for e in extras if key in e and _is_number(e[key])]
        if values:
            out[f"{METRIC_PREFIX}/{name}/{key}"] = sum(values) / len(values)
    return out


def extra_columns(extras: list[dict[str, Any]], name: str) -> dict[str, list]:
    """``<name>/<key>`` -> one value per completion (None where absent), for keys whose values are all JSON
    scalars (numbers, strings, booleans, None)."""
    keys = dict.fromkeys(k for e in extras for k in e)
    columns = {key: [e.get(key) for e in extras] for key in keys}
    return {f"{name}/{key}": values for key, values in columns.items()
            if all(isinstance(v, _JSON_SCALARS) for v in values)}


def finish(results: list, name: str, context: dict[str, Any]) -> list:
    """The rewards of a batch's verl results; their extra values go to ``log_metric`` / ``log_extra`` when
    ``context`` (the call's keyword arguments) has them."""
    rewards, extras = zip(*(split_result(r, name) for r in results)) if results else ((), ())
    log_metric, log_extra = context.get("log_metric"), context.get("log_extra")
    if any(extras) and log_metric is not None:
        for metric, value in extra_metrics(list(extras), name).items():
            log_metric(metric, value)
    if any(extras) and log_extra is not None:
        for column, values in extra_columns(list(extras), name).items():
            log_extra(column, values)
    return list(rewards)


def from_verl(fn: Callable[..., Any], name: str | None = None) -> RewardFn:
    """A grpo batch reward function (``fn(prompts=, completions=, **columns) -> list``) that calls the
    verl-style ``fn`` once per completion (see the module docstring); ``async def`` functions are awaited
    concurrently. Its ``__name__`` is ``name`` or ``fn``'s, and ``verl_score_fn`` is ``fn``."""
    name = name or verl_name(fn)
    takes = accepted_arguments(fn, name)

    if inspect.iscoroutinefunction(fn):
        async def reward(prompts: list, completions: list, **columns: Any) -> list:
            calls = verl_calls(completions, columns, takes, name)
            return finish(list(await asyncio.gather(*(fn(**c) for c in calls))), name, columns)
    else:
        def reward(prompts: list, completions: list, **columns: Any) -> list:
            calls = verl_calls(completions, columns, takes, name)
            return finish([fn(**c) for c in calls], name, columns)

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = f"verl reward function '{name}' called once per completion (grpo.rewards.verl.from_verl)."
    reward.verl_score_fn = fn
    return reward


def adapt_reward(name: str, fn: Any) -> tuple[str, Any]:
    """``(name, from_verl(fn, name))`` when ``fn`` has verl's signature, else ``(name, fn)`` unchanged."""
    if is_verl_score_fn(fn):
        return name, from_verl(fn, name)
    return name, fn
