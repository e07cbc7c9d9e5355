"""Built-in rewards for the embedded arithmetic task (TRL's reward signature)."""

from __future__ import annotations

from grpo.tasks.arithmetic import format_ok, is_correct


def accuracy_reward(prompts: list, completions: list[str], answer: list | None = None, **_: object) -> list[float | None]:
    """1.0 when the `<answer>` equals the reference `answer` column, else 0.0 (None without one)."""
    if answer is None:
        return [None] * len(completions)
    return [None if a is None else float(is_correct(c, str(a))) for c, a in zip(completions, answer)]


def format_reward(prompts: list, completions: list[str], **_: object) -> list[float | None]:
    """1.0 for a strict `<think>...</think><answer>...</answer>` completion, else 0.0."""
    return [float(format_ok(c)) for c in completions]


BUILTIN_REWARDS = {"accuracy": accuracy_reward, "format": format_reward}
