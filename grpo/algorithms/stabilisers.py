"""DeepSeek-V3.2's GRPO stabilisers and the correction of rollout / training mismatch: pure functions.

DeepSeek-V3.2 (DeepSeek-AI, 2025, arXiv 2512.02556, section 3.1 "Scaling GRPO"):

* unbiased KL estimate: the k3 estimate is taken under pi_old's samples, so it is re-weighted by the
  importance ratio to estimate KL(pi_theta || pi_ref) under pi_theta:

      D_it = pi_theta(o_it) / pi_old(o_it) * [ pi_ref/pi_theta - log(pi_ref/pi_theta) - 1 ]    (eq. 7)

  (TRL: ``use_bias_correction_kl``; ``algorithm.kl_ratio_correction``). The ratio carries the gradient:
  it is the importance ratio of ``algorithm.importance_sampling_level`` (token: ``exp(logp - old)``;
  sequence: ``exp(1/|o_i| sum_t (logp - old))``, through the mean, as TRL).
* off-policy sequence masking (eq. 8-9): a completion with A_i < 0 whose mean log-ratio to the
  sampling policy, 1/|o_i| sum_t log(pi_sampler / pi_theta), exceeds delta leaves the policy term:

      M_i = 0  if A_i < 0 and 1/|o_i| sum_t (log pi_sampler(o_it) - log pi_theta(o_it)) > delta,  else 1

  (TRL: ``off_policy_mask_threshold``). ``OFF_POLICY_MEASURES`` also holds ``ratio``: the sequence
  ratio s_i = exp(1/|o_i| sum_t (logp - log pi_sampler)) outside [1/c, c].
* per-domain beta: ``domain_betas`` maps each row's domain to its KL coefficient.

Truncated / masked importance sampling (TIS / MIS; Yao et al., 2025, "Your efficient RL framework
secretly brings you off-policy RL training"; TRL ``vllm_importance_sampling_mode``): the rollout's
log-probs come from another numeric path (bf16 sampler, other kernels) than the training forward, so
the policy term is weighted by w = pi_old / pi_sampler, truncated (TIS) or masked to 0 outside
[C_min, C_max] (MIS), per token or per sequence (sum of the log-ratios, as TRL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from grpo.algorithms.params import NoParams, param, require

# ---------------------------------------------------------------- unbiased KL (k3 x importance ratio)


def _masked_row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1/|o_i| sum_t x_it m_it.  Shape: [n, T] -> [n, 1]."""
    return (x * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)


#: log of the ratio that multiplies the KL estimate, per importance_sampling_level; carries gradient.
KL_CORRECTION_LOG_RATIOS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": lambda logp, old, mask: logp - old,                                  # [n, T]
    "sequence": lambda logp, old, mask: _masked_row_mean(logp - old, mask),       # [n, 1] (TRL's coef_1)
}


def unbiased_kl(kl: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                level: str = "token") -> torch.Tensor:
    """DeepSeek-V3.2 eq. 7: ``kl * pi_theta / pi_old`` at the importance-sampling ``level``.

    With mu = 1 (old = logp.detach()) the value equals ``kl`` but the gradient gains
    ``kl_it * d log rho``: the term that makes the estimate's gradient unbiased.

    Shape: kl, logp, old_logp, mask [n, T] -> [n, T]
    """
    if level not in KL_CORRECTION_LOG_RATIOS:
        raise ValueError(f"kl_ratio_correction: no ratio for importance_sampling_level '{level}'")
    return kl * torch.exp(KL_CORRECTION_LOG_RATIOS[level](logp, old_logp, mask.to(logp.dtype)))

# ---------------------------------------------------------------- off-policy sequence masking


def _seq_kl_to_sampler(logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1/|o_i| sum_t (log pi_sampler - log pi_theta) (DeepSeek-V3.2 eq. 9).  [n, T] -> [n]."""
    return _masked_row_mean(sampled - logp, mask).squeeze(1)


def _seq_ratio_spread(logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max(s_i, 1/s_i), s_i = exp(1/|o_i| sum_t (log pi_theta - log pi_sampler)).  [n, T] -> [n]."""
    return torch.exp(_masked_row_mean(logp - sampled, mask).abs()).squeeze(1)


OFF_POLICY_MEASURES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "kl": _seq_kl_to_sampler,        # DeepSeek-V3.2 / TRL; threshold delta (TRL's example: 0.5)
    "ratio": _seq_ratio_spread,      # threshold c > 1: drop when s_i > c or s_i < 1/c
}


@dataclass(frozen=True)
class KlMaskParams:
    threshold: float | None = param(None, "Completions with A < 0 whose measure to the sampling policy exceeds this "
                                    "leave the policy term (kl: delta, TRL's off_policy_mask_threshold, e.g. 0.5; "
                                    "ratio: c > 1); empty = off.")


@dataclass(frozen=True)
class RatioMaskParams(KlMaskParams):
    def __post_init__(self) -> None:
        require(self.threshold is None or self.threshold > 1, "threshold must be > 1 (or empty)")


#: algorithm.off_policy_mask: the measure (entry) and its threshold; no threshold = no masking (the default).
OFF_POLICY_MASK_PARAMS: dict[str, type] = {"kl": KlMaskParams, "ratio": RatioMaskParams}


def off_policy_sequence_mask(advantages: torch.Tensor, logp: torch.Tensor, sampled: torch.Tensor,
                             mask: torch.Tensor, threshold: float, measure: str = "kl") -> torch.Tensor:
    """DeepSeek-V3.2 eq. 8-9: 0 for the tokens of completions with negative advantage whose
    ``OFF_POLICY_MEASURES[measure]`` to the sampling policy exceeds ``threshold``, else 1. Detached.

    Per-token advantages [n, T] (process supervision) are judged token by token (as TRL).

    Shape: advantages [n] or [n, T]; logp, sampled, mask [n, T] -> [n, 1] or [n, T] float
    """
    m = mask.to(logp.dtype)
    far = OFF_POLICY_MEASURES[measure](logp.detach(), sampled, m) > threshold          # [n]
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages             # [n, 1] | [n, T]
    return ((adv >= 0) | ~far.unsqueeze(1)).to(logp.dtype)

# ---------------------------------------------------------------- TIS / MIS rollout correction


def _truncate(w: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    return torch.clamp(w, min=lo, max=hi)


def _mask_out(w: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    low = -math.inf if lo is None else lo
    high = math.inf if hi is None else hi
    return w.masked_fill((w < low) | (w > high), 0.0)


#: mode -> (per-sequence?, what happens outside [C_min, C_max]); TRL's vllm_importance_sampling_mode names.
ROLLOUT_CORRECTIONS: dict[str, tuple[bool, Callable]] = {
    "token_truncate": (False, _truncate),       # TIS per token
    "token_mask": (False, _mask_out),           # MIS per token
    "sequence_truncate": (True, _truncate),     # TIS on the sequence ratio
    "sequence_mask": (True, _mask_out),         # MIS on the sequence ratio (TRL's default mode)
}


@dataclass(frozen=True)
class RolloutCorrectionParams:
    min: float | None = param(None, "Lower bound C_min of the weight (empty = none).")
    max: float | None = param(3.0, "Upper bound C_max of the weight (TRL: 3.0).")

    def __post_init__(self) -> None:
        require(self.min is None or self.max is None or 0 <= self.min < self.max, "min must be >= 0 and below max")


ROLLOUT_CORRECTION_PARAMS: dict[str, type] = {"none": NoParams,
                                              **{name: RolloutCorrectionParams for name in ROLLOUT_CORRECTIONS}}


def rollout_correction_weights(old_logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor, mode: str,
                               clip_min: float | None = None, clip_max: float | None = 3.0) -> torch.Tensor:
    """TIS / MIS weights of the policy term, detached:

        token:    w_it = exp(log pi_old(o_it) - log pi_sampler(o_it))
        sequence: w_i  = exp(sum_t m_it (log pi_old(o_it) - log pi_sampler(o_it)))
        *_truncate: clamp(w, C_min, C_max);   *_mask: w, or 0 outside [C_min, C_max]

    ``old_logp`` is the training forward of the policy that sampled (mu = 1: the update's first pass).

    Shape: old_logp, sampled, mask [n, T] -> [n, T] (token) or [n, 1] (sequence)
    """
    per_sequence, bound = ROLLOUT_CORRECTIONS[mode]
    diff = (old_logp.detach() - sampled) * mask.to(old_logp.dtype)                    # [n, T]
    log_w = diff.sum(dim=1, keepdim=True) if per_sequence else diff
    return bound(torch.exp(log_w), clip_min, clip_max)

# ---------------------------------------------------------------- per-domain beta


def domain_betas(domains: list, table: dict[str, float], default: float, device: torch.device) -> torch.Tensor:
    """beta of each row: ``table[domain]``, ``default`` for a domain not in the table (or None).

    Shape: N domain labels -> [N] float32
    """
    return torch.tensor([float(table.get(str(d), default)) if d is not None else default for d in domains],
                        dtype=torch.float32, device=device)
