"""Typed values passed between the stages of one training step (data flows one way).

``PromptBatch`` -> ``Generation`` (rollout) -> ``Scored`` (rewards) -> ``Groups`` -> ``TrainBatch`` and
``Experience`` (training/experience) -> ``UpdateStats`` (training/update) -> ``StepSummary`` (metrics);
``TrainState`` is what a checkpoint holds.
Shapes: B prompts, G completions each, N = B * G rows; P prompt length, T completion length.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from grpo.accelerator import host_copy
from grpo.algorithms.advantages import Advantages
from grpo.algorithms.rollout_stats import repeated_ngram_rows


@dataclass
class PromptBatch:
    """B prompts, tokenized and left-padded, with their dataset columns."""

    prompts: list[Any]                 # B raw prompts as given to reward functions (strings or message lists)
    prompt_ids: torch.Tensor           # [B, P] long, left-padded
    prompt_mask: torch.Tensor          # [B, P] long, 1 on real tokens
    columns: dict[str, list[Any]] = field(default_factory=dict)  # every other column, B values each
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # extra forward inputs, [B, ...] each
                                                                          # (a VLM's pixel_values [B, 3, H, W])


@dataclass
class Scored:
    """Rewards of N completions: one column per reward function, and their weighted sum."""

    names: list[str]                   # R reward function names
    per_function: torch.Tensor         # [N, R] float32, NaN where a function returned None
    total: torch.Tensor                # [N] float32, weighted sum over the functions that applied
    errors: dict[str, int] = field(default_factory=dict)


class HostView:
    """The host side of a batch: its token ids, attention mask and completion mask on the CPU, where every decision
    about the step's structure is made (micro-batches, padding trimmed, distinct prompts, the loss normaliser), so the
    step reads nothing back from the device for them. On the CPU these are the batch's own tensors; on an accelerator
    one copy per step (grpo.accelerator.host_copy) or what the rollout already holds on the host.
    A plain class (not a dataclass): DDP's input mover leaves it on the host."""

    __slots__ = ("input_ids", "attention_mask", "completion_mask")

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor | None):
        self.input_ids, self.attention_mask, self.completion_mask = input_ids, attention_mask, completion_mask

    @classmethod
    def of(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor,
           completion_mask: torch.Tensor | None = None) -> "HostView":
        return cls(host_copy(input_ids), host_copy(attention_mask),
                   None if completion_mask is None else host_copy(completion_mask))

    def rows(self, idx) -> "HostView":
        return HostView(self.input_ids[idx], self.attention_mask[idx],
                        None if self.completion_mask is None else self.completion_mask[idx])


@dataclass
class TrainBatch:
    """Everything the update needs: sequences, completion mask, advantages, fixed log-probs."""

    input_ids: torch.Tensor            # [N, P + T] prompt (left-padded) then completion (right-padded)
    attention_mask: torch.Tensor       # [N, P + T]
    completion_mask: torch.Tensor      # [N, T] float32, 1 on tokens that enter the loss (filters multiplied in)
    advantages: torch.Tensor           # [N] one per completion (broadcast to its tokens) or [N, T] per token
    old_logprobs: torch.Tensor | None  # [N, T] log pi_old (None when mu == 1: pi_old = pi_theta.detach())
    ref_logprobs: torch.Tensor | None  # [N, T] log pi_ref (None when beta == 0)
    sampling_logprobs: torch.Tensor | None = None   # [N, T] what the rollout sampled with (None: top-k/top-p
                                                    # filtered or greedy, not comparable with the policy's)
    beta: torch.Tensor | None = None   # [N] per-row KL coefficient (algorithm.beta_by_domain); None = algorithm.beta
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # [N, ...] extra forward inputs (pixel_values)
    host: HostView | None = None       # the host side (None: copied on first use, once per step)

    @property
    def completion_length(self) -> int:
        return self.completion_mask.shape[1]

    def host_view(self) -> HostView:
        """The batch's :class:`HostView`, copied from the device once and kept."""
        if self.host is None:
            self.host = HostView.of(self.input_ids, self.attention_mask, self.completion_mask)
        return self.host

    def rows(self, idx: slice) -> "TrainBatch":
        """A micro-batch: the same fields restricted to rows `idx` (a slice or host row indices)."""
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return TrainBatch(self.input_ids[idx], self.attention_mask[idx], self.completion_mask[idx],
                          self.advantages[idx], pick(self.old_logprobs), pick(self.ref_logprobs),
                          pick(self.sampling_logprobs), pick(self.beta),
                          {k: v[idx] for k, v in self.model_inputs.items()}, self.host_view().rows(idx))



@dataclass
class Generation:
    """Output of :func:`sample`; N = B * G rows, row ``i * G + g`` is sample ``g`` of prompt ``i``.

    Shape:
        prompt_ids, prompt_mask: [N, P] long, left-padded, mask 1 on real prompt tokens.
        completion_ids: [N, T] long, ``pad_token_id`` after EOS; T = longest completion produced.
        completion_mask: [N, T] long, 1 up to and including the EOS token, 0 after.
        sampling_logprobs: [N, T] float32, log-prob of each token under the distribution it was
            sampled from (after temperature / top-k / top-p); 0 where the mask is 0.
        truncated: [N] bool, True when the completion hit ``max_new_tokens`` without EOS.
        action_mask: [N, T] long or None, multi-turn episodes (grpo/rollout/multiturn.py): 1 on the
            tokens the model sampled, 0 on observation tokens fed back to it (context, never trained on).
        model_inputs: name -> [N, ...], the prompts' extra forward inputs repeated G times (a VLM's
            pixel_values); every forward over these rows' prompts gets them (docs/vlm.md).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    truncated: torch.Tensor
    action_mask: torch.Tensor | None = None
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def loss_mask(self) -> torch.Tensor:
        """The tokens the loss and the KL see: every completion token, less observation tokens.  [N, T] long"""
        return self.completion_mask if self.action_mask is None else self.completion_mask * self.action_mask


@dataclass
class Groups:
    """Completions of whole groups (rows i*G .. i*G+G-1 belong to one prompt), scored."""

    gen: Generation
    prompts: list[Any]                       # [N] prompt of each row, as reward functions see it
    columns: dict[str, list[Any]]            # [N] values of every other dataset column
    completions: list[str]                   # [N] decoded texts (rewards get them as chat_completions)
    per_function: torch.Tensor               # [N, R] rewards, NaN = None
    total: torch.Tensor                      # [N] combined reward (NaN = no reward at all)
    sample_s: float = 0.0                    # seconds spent sampling these completions
    errors: dict[str, int] = field(default_factory=dict)  # per function: rewards zeroed after an error
    metrics: dict[str, float] = field(default_factory=dict)  # of the sampling itself (tools/*, env/* of episodes)


@dataclass
class Experience:
    """Everything one GRPO step trains on (grpo.training.experience.make_experience)."""

    batch: TrainBatch
    groups: Groups
    scored: Scored
    advantages: Advantages                   # grpo.algorithms.advantages: values [N] or [N, T], group counts
    metrics: dict[str, float] = field(default_factory=dict)

    def summary(self) -> StepSummary:
        """What the step's metrics read (merged over ranks under torchrun: grpo.types.StepSummary.merge)."""
        gen = self.groups.gen
        return StepSummary(self.scored, gen.completion_mask, gen.truncated, self.advantages.zero_std_groups,
                           self.advantages.num_groups, self.groups.sample_s, dict(self.metrics),
                           repeated_ngram_rows(gen.completion_ids, gen.completion_mask))


@dataclass
class UpdateStats:
    """What one policy update reports (grpo.training.update.policy_update)."""

    loss: float
    policy_loss: float
    kl_loss: float
    kl: float               # mean per-token KL(pi_theta || pi_ref) estimate (nan when beta == 0)
    clip_fraction: float    # share of active tokens whose ratio was clipped
    entropy: float          # mean per-token entropy of the policy
    grad_norm: float        # before clipping
    lr: float
    skipped: bool           # True when the loss or gradient was not finite (no step taken)
    dual_clip_fraction: float = 0.0  # share of loss tokens capped by the dual clip (clip_ratio_c)
    entropy_loss: float = 0.0        # the -entropy_coef * H share of the loss
    rollout_logprob_diff: float = float("nan")   # mean |log pi_theta - log pi_sampler| per loss token (mu = 1)
    clip_high_fraction: float = 0.0  # share of active tokens clipped at 1 + epsilon_high (the rest of clip_fraction: low)


@dataclass
class TrainState:
    """Everything a checkpoint captures and a resume restores."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    reference: Any                 # None, grpo.modeling.reference.FrozenCopy or AdapterDisabled
    stream: Any                    # grpo.data.prompts.PromptStream; its position also keys the sampling (grpo/rollout/keyed.py)
    #: stateful additions to the loop (grpo.training.reward_model_updates.build_extras): each has
    #: after_step(step, experience) -> metrics, save(checkpoint_dir) and load(checkpoint_dir)
    extras: list[Any] = field(default_factory=list)


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
    repeated: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool, device="cpu"))  # [N] 4-gram x8

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
