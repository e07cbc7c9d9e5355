"""Reward functions: the protocol, the registry of built-ins, and scoring.

A reward function has TRL's signature::

    fn(prompts: list, completions: list[str], **columns) -> list[float | None]

one value per completion; every dataset column (e.g. ``answer``) is passed by name, one value per
completion. ``None`` means "does not apply to this sample": it is left out of that function's
mean and of the weighted sum. ``async def`` functions are awaited.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import math
from pathlib import Path
from typing import Any, Callable

import torch

from grpo.rewards.builtin import BUILTIN_REWARDS
from grpo.types import Scored

RewardFn = Callable[..., Any]


class RewardError(ValueError):
    """A reward function that cannot be loaded or returned something unusable (one-line message)."""


def load_reward(spec: str) -> tuple[str, RewardFn]:
    """Resolve a built-in name, `path/to/file.py:function` or a reward-model directory to (name, function).

    A directory holding a single-label ``...ForSequenceClassification`` model becomes
    ``("rm:<dirname>", scorer)`` (see grpo/rewards/reward_model.py).
    """
    if spec in BUILTIN_REWARDS:
        return spec, BUILTIN_REWARDS[spec]
    if Path(spec).is_dir():
        from grpo.rewards.reward_model import load_reward_model

        return load_reward_model(spec)
    path, sep, fn_name = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise RewardError(f"unknown reward '{spec}': use one of {sorted(BUILTIN_REWARDS)}, path/to/file.py:function "
                          "or a reward-model directory")
    file = Path(path)
    if not file.is_file():
        raise RewardError(f"reward file not found: {file}")
    module_spec = importlib.util.spec_from_file_location(f"grpo_user_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report which one failed and why, in one line
        raise RewardError(f"reward file {file} failed to import: {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise RewardError(f"reward file {file} has no function '{fn_name}'")
    return fn_name, fn


def _call(name: str, fn: RewardFn, prompts: list, completions: list[str], columns: dict[str, list]) -> list:
    try:
        out = fn(prompts, completions, **columns)
        if inspect.isawaitable(out):
            out = asyncio.run(out)
    except Exception as e:
        raise RewardError(f"reward function '{name}' raised {type(e).__name__}: {e}") from None
    if out is None or len(out) != len(completions):
        raise RewardError(f"reward function '{name}' must return one value per completion "
                          f"({len(completions)}), got {None if out is None else len(out)}")
    return list(out)


def score(functions: list[tuple[str, RewardFn]], weights: list[float] | None, prompts: list,
          completions: list[str], columns: dict[str, list]) -> Scored:
    """Run every reward function and combine: total_i = sum_k w_k r_ik over the k with r_ik not None.

    Shape: N completions -> per_function [N, R] (NaN = None), total [N]
    """
    weights = weights or [1.0] * len(functions)
    table = torch.full((len(completions), len(functions)), float("nan"))
    for k, (name, fn) in enumerate(functions):
        for i, value in enumerate(_call(name, fn, prompts, completions, columns)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RewardError(f"reward function '{name}' returned {value!r} for completion {i}: "
                                  "expected a finite number or None")
            table[i, k] = float(value)
    w = torch.tensor(weights, dtype=torch.float32)                          # [R]
    total = torch.nansum(table * w, dim=1)                                  # [N] None contributes 0
    return Scored(names=[n for n, _ in functions], per_function=table, total=total)
