"""The registry of built-in rewards (TRL's reward signature, called by keyword), by name.

Every built-in takes ``prompts`` and ``completions`` (strings or lists of chat messages, read
through grpo/rewards/text.py ``as_text``) and ignores the columns it does not use (``**_``).

=====================  ==========================================================================
accuracy, format       the embedded arithmetic task: integer ``<answer>``; the think/answer format (empty reasoning allowed)
exact_match            the last ``<answer>`` block equals the ``answer`` column (the strings task)
math_accuracy          final answer (``<answer>`` / last ``\\boxed{}``) vs ``answer``/``solution``, math-verify
think_format           strict ``<think>…</think><answer>…</answer>`` -> 1.0 / 0.0
tag_count              0.25 per well-placed ``<think>``, ``</think>``, ``<answer>``, ``</answer>``
cosine_length          cosine-scaled length reward (Yeo et al., 2025)            parameters
repetition_penalty     n-gram repetition penalty                                  parameters
soft_overlong          DAPO soft overlong punishment from token lengths           parameters
language_consistency   share of the reasoning in the target language (DeepSeek-R1) parameters
code_execution         run the completion's code against the ``tests`` column (grpo/rewards/code.py)
=====================  ==========================================================================

Rewards with parameters have a factory in ``REWARD_FACTORIES``; ``name:key=value,key=value``
(values read as YAML) builds an instance, e.g. ``cosine_length:max_len=512``.
"""

from __future__ import annotations

from grpo.rewards.language import language_consistency, make_language_consistency
from grpo.rewards.math_answer import math_accuracy
from grpo.rewards.shaping import (cosine_length, make_cosine_length, make_repetition_penalty, make_soft_overlong,
                                  repetition_penalty, soft_overlong)
from grpo.rewards.text import answer_block, as_text, integer_answer_correct, tag_count, think_answer_parts, think_format


def accuracy_reward(prompts: list, completions: list[str], answer: list | None = None, **_: object) -> list[float | None]:
    """1.0 when the `<answer>` equals the reference `answer` column, else 0.0 (None without one)."""
    if answer is None:
        return [None] * len(completions)
    return [None if a is None else float(integer_answer_correct(as_text(c), str(a))) for c, a in zip(completions, answer)]


def exact_match(prompts: list, completions: list, answer: list | None = None, **_: object) -> list[float | None]:
    """1.0 when the last `<answer>` block, stripped, equals the `answer` column exactly, else 0.0 (None
    without one): the strings task's verifier."""
    if answer is None:
        return [None] * len(completions)
    return [None if a is None else float(answer_block(as_text(c)) == str(a).strip()) for c, a in zip(completions, answer)]


def format_reward(prompts: list, completions: list[str], **_: object) -> list[float | None]:
    """1.0 for a strict `<think>...</think><answer>...</answer>` completion, else 0.0."""
    return [float(think_answer_parts(as_text(c)) is not None) for c in completions]


def code_execution(prompts: list, completions: list, **columns: object) -> list:
    """Runs the completion's code against the row's tests; see grpo.rewards.code.code_execution
    (imported on first use)."""
    from grpo.rewards.code import code_execution as run

    return run(prompts=prompts, completions=completions, **columns)


BUILTIN_REWARDS = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "exact_match": exact_match,
    "math_accuracy": math_accuracy,
    "think_format": think_format,
    "tag_count": tag_count,
    "cosine_length": cosine_length,
    "repetition_penalty": repetition_penalty,
    "soft_overlong": soft_overlong,
    "language_consistency": language_consistency,
    "code_execution": code_execution,
}

REWARD_FACTORIES = {
    "cosine_length": make_cosine_length,
    "repetition_penalty": make_repetition_penalty,
    "soft_overlong": make_soft_overlong,
    "language_consistency": make_language_consistency,
}
