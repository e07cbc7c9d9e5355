"""Typed values passed between the stages of one training step (data flows one way).

``PromptBatch`` -> ``Generation`` (grpo.rollout) -> ``Scored`` -> ``TrainBatch``.
Shapes: B prompts, G completions each, N = B * G rows; P prompt length, T completion length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
