"""Typed values passed between the stages of one training step (data flows one way).

``PromptBatch`` -> ``Generation`` (grpo.rollout) -> ``Scored`` -> ``TrainBatch``.
Shapes: B prompts, G completions each, N = B * G rows; P prompt length, T completion length.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class PromptBatch:
    """B prompts, tokenized and left-padded, with their dataset columns."""

    prompts: list[Any]                 # B raw prompts as given to reward functions (strings or message lists)
    prompt_ids: torch.Tensor           # [B, P] long, left-padded
    prompt_mask: torch.Tensor          # [B, P] long, 1 on real tokens
    columns: dict[str, list[Any]] = field(default_factory=dict)  # every other column, B values each


@dataclass
class Scored:
    """Rewards of N completions: one column per reward function, and their weighted sum."""

    names: list[str]                   # R reward function names
    per_function: torch.Tensor         # [N, R] float32, NaN where a function returned None
    total: torch.Tensor                # [N] float32, weighted sum over the functions that applied
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class TrainBatch:
    """Everything the update needs: sequences, completion mask, advantages, fixed log-probs."""

    input_ids: torch.Tensor            # [N, P + T] prompt (left-padded) then completion (right-padded)
    attention_mask: torch.Tensor       # [N, P + T]
    completion_mask: torch.Tensor      # [N, T] float32, 1 on tokens that enter the loss (filters multiplied in)
    advantages: torch.Tensor           # [N] one per completion (broadcast to its tokens) or [N, T] per token
    old_logprobs: torch.Tensor | None  # [N, T] log pi_old (None when mu == 1: pi_old = pi_theta.detach())
    ref_logprobs: torch.Tensor | None  # [N, T] log pi_ref (None when beta == 0)

    @property
    def completion_length(self) -> int:
        return self.completion_mask.shape[1]

    def rows(self, idx: slice) -> "TrainBatch":
        """A micro-batch: the same fields restricted to rows `idx`."""
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return TrainBatch(self.input_ids[idx], self.attention_mask[idx], self.completion_mask[idx],
                          self.advantages[idx], pick(self.old_logprobs), pick(self.ref_logprobs))


#: Step metrics that add up over ranks (the others are averaged): counts, not rates.
SUMMED_METRICS = ("completion/overlong_filtered",)


@dataclass
class StepSummary:
    """What one step's metrics read of its experience (grpo.state.metrics.step_metrics): the same object
    in one process and, merged over ranks by :meth:`merge`, under torchrun."""

    scored: Scored                     # per_function [N, R], total [N]
    completion_mask: torch.Tensor      # [N, T] long
    truncated: torch.Tensor            # [N] bool
    zero_std_groups: int               # groups whose rewards all tie (advantage 0)
    num_groups: int
    sample_s: float                    # seconds of sampling (the slowest rank's when merged)
    metrics: dict[str, float] = field(default_factory=dict)

    def to_host(self) -> "StepSummary":
        """The same summary with its tensors on the CPU (for all_gather_object)."""
        return StepSummary(**{f.name: _to_host(getattr(self, f.name)) for f in fields(self)})

    @staticmethod
    def merge(parts: list["StepSummary"]) -> "StepSummary":
        """Every rank's summary as one: rows concatenated (completions right-padded to the widest), counts
        summed, the sampling time the slowest rank's, metrics averaged (SUMMED_METRICS summed). Field by
        field, by type: a new field of another type is a TypeError here, not a silently wrong metric."""
        return StepSummary(**{f.name: _merge([getattr(p, f.name) for p in parts], f.name) for f in fields(StepSummary)})


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, Scored):
        return Scored(value.names, value.per_function.cpu(), value.total.cpu(), dict(value.errors))
    return value


def _merge(values: list[Any], name: str) -> Any:
    first = values[0]
    if isinstance(first, Scored):
        errors: dict[str, int] = {}
        for v in values:
            for k, n in v.errors.items():
                errors[k] = errors.get(k, 0) + n
        return Scored(first.names, torch.cat([v.per_function for v in values]), torch.cat([v.total for v in values]),
                      errors)
    if isinstance(first, torch.Tensor):
        if first.dim() == 2:                                     # [n, T]: pad to the widest T
            width = max(v.shape[1] for v in values)
            values = [torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values]
        return torch.cat(values)
    if isinstance(first, bool) or not isinstance(first, (int, float, dict)):
        raise TypeError(f"StepSummary.merge: no rule for field {name!r} of type {type(first).__name__}")
    if isinstance(first, int):
        return sum(values)
    if isinstance(first, float):
        return max(values)
    return {k: (sum if k in SUMMED_METRICS else (lambda xs: sum(xs) / len(xs)))([v[k] for v in values])
            for k in first}
