"""Process supervision: step-reward functions that score every reasoning step of a completion.

A step-reward function is called by keyword like a reward function, with ``steps`` added, and
returns, per completion, a list with one reward per step (or None when it does not apply)::

    fn(prompts=, completions=, steps=list[list[str]], completion_ids=, **columns) -> list[list[float] | None]

Steps are the pieces of the completion's text between occurrences of `reward.step_delimiter` (a
trailing empty piece is not a step); a conversational completion (a list of messages) is split
by its text (grpo/rewards/text.py ``as_text``). Several functions are added step by step.
"""

from __future__ import annotations

import math

from grpo.rewards import RewardError, _call
from grpo.rewards.text import as_text


def split_steps(completion: str, delimiter: str) -> list[str]:
    """'a\\nb\\n' -> ['a\\n', 'b\\n']: each step keeps its closing delimiter; empty tail dropped."""
    pieces = completion.split(delimiter)
    steps = [p + delimiter for p in pieces[:-1]]
    if pieces[-1]:
        steps.append(pieces[-1])
    return steps


def score_steps(functions, prompts: list, completions: list, columns: dict[str, list],
                delimiter: str, timeout_s: float = 0.0) -> list[list[float]]:
    """Per completion, the summed step rewards of every step-reward function ([] = no reward);
    each is called as ``fn(prompts=, completions=, steps=, **columns)``, bounded by ``timeout_s``
    (``reward.timeout_s``, 0 = no limit)."""
    steps = [split_steps(as_text(c), delimiter) for c in completions]
    totals: list[list[float]] = [[] for _ in completions]
    for name, fn in functions:
        out = _call(name, fn, prompts, completions, {**columns, "steps": steps}, timeout_s)
        for i, values in enumerate(out):
            if values is None:
                continue
            if not isinstance(values, (list, tuple)) or len(values) != len(steps[i]):
                raise RewardError(f"step reward function '{name}' must return one reward per step for "
                                  f"completion {i} ({len(steps[i])} steps), got {values!r}")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
                raise RewardError(f"step reward function '{name}' returned a non-finite or non-numeric "
                                  f"step reward for completion {i}: {values!r}")
            totals[i] = [a + float(b) for a, b in zip(totals[i], values)] if totals[i] else [float(v) for v in values]
    return totals
