"""The GRPO objective as small pure functions (tensors in, tensors out).

DeepSeekMath (Shao et al., 2024), eq. 3, written as a loss to minimise:

    L = 1/N sum_i 1/|o_i| sum_t [ -min(rho_it A_i, clip(rho_it, 1-eps_low, 1+eps_high) A_i)
                                  + beta * D_KL(pi_theta || pi_ref)_it ]
    rho_it = exp(log pi_theta(o_it) - log pi_old(o_it))
    D_KL ~ k3 = exp(ref - logp) - (ref - logp) - 1          (Schulman, "Approximating KL", 2020)

Variants are registry entries: ``KL_ESTIMATORS`` (``algorithm.kl_estimator``) and
``AGGREGATIONS`` (``algorithm.loss_agg_mode``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# ---------------------------------------------------------------- KL estimators (per token)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref (unbiased, can be negative).  Shape: [N, T] -> [N, T]."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (logp - ref)^2 (low variance, biased, >= 0).  Shape: [N, T] -> [N, T]."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased, >= 0; DeepSeekMath eq. 4).

    Shape: [N, T] -> [N, T]
    """
    d = ref_logp - logp                                         # [N, T]
    return torch.exp(d) - d - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1, "k2": kl_k2, "k3": kl_k3,
}

# ---------------------------------------------------------------- clipped surrogate


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, negated to a loss, per token.

        loss_it = -min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i)

    Returns the per-token loss and a bool mask of tokens where the clipped term was the one taken
    (the gradient of those tokens is zero).

    Shape:
        logp, old_logp: [N, T]; advantages: [N]  ->  loss: [N, T], clipped: [N, T] bool
    """
    ratio = torch.exp(logp - old_logp)                          # [N, T]
    adv = advantages.unsqueeze(1)                               # [N, 1]
    unclipped = ratio * adv                                     # [N, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv  # [N, T]
    is_clipped = clipped < unclipped                            # min picked the clipped side
    return -torch.minimum(unclipped, clipped), is_clipped

# ---------------------------------------------------------------- aggregation
# Each mode splits the loss into a per-micro-batch numerator and a normaliser computed once over
# the whole optimizer step, so accumulating micro-batches gives exactly the full-batch loss.


@dataclass(frozen=True)
class Aggregation:
    numerator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (values [n, T], mask [n, T]) -> scalar
    normalizer: Callable[[torch.Tensor, int], float]                 # (mask of the whole step [N, T], L) -> float


def _seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_i (sum_t v_it m_it / |o_i|): each completion's mean over its own tokens."""
    return ((values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()


def _token_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_it v_it m_it."""
    return (values * mask).sum()


AGGREGATIONS: dict[str, Aggregation] = {
    # GRPO (DeepSeekMath): mean over each completion's tokens, then mean over completions.
    "seq-mean-token-mean": Aggregation(_seq_mean_token_mean, lambda mask, L: float(mask.shape[0])),
    # DAPO: mean over every active token of the step.
    "token-mean": Aggregation(_token_sum, lambda mask, L: float(mask.sum().clamp(min=1))),
    # Sum over each completion's tokens, mean over completions (long completions weigh more).
    "seq-mean-token-sum": Aggregation(_token_sum, lambda mask, L: float(mask.shape[0])),
    # Dr. GRPO: token sum divided by a constant L (default: the maximum completion length), then
    # mean over completions, so no length bias enters through a per-completion 1/|o_i|.
    "seq-mean-token-sum-norm": Aggregation(_token_sum, lambda mask, L: float(mask.shape[0] * L)),
}


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (0 when the mask is empty).  Shape: [...] -> []."""
    return (values * mask).sum() / mask.sum().clamp(min=1)

# ---------------------------------------------------------------- the full objective


@dataclass
class LossTerms:
    """One micro-batch's share of the step loss, and sums for metrics."""

    loss: torch.Tensor          # scalar with grad; the micro-batch shares add up to the step loss
    policy: float               # share of the policy (surrogate) term
    kl_term: float              # share of the beta * KL term
    kl_sum: float               # sum of per-token KL over active tokens (for the mean KL metric)
    clipped_sum: float          # active tokens whose ratio was clipped
    tokens: float               # active tokens in this micro-batch


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, epsilon: float, epsilon_high: float | None,
              beta: float, kl_estimator: str = "k3", agg_mode: str = "seq-mean-token-mean",
              normalizer: float) -> LossTerms:
    """GRPO loss of a micro-batch (see module docstring).

    ``normalizer`` comes from ``AGGREGATIONS[agg_mode].normalizer(mask_of_whole_step, L)``.

    Shape:
        logp, old_logp, ref_logp, mask: [n, T]; advantages: [n]  ->  scalar loss
    """
    mask = mask.to(logp.dtype)
    agg = AGGREGATIONS[agg_mode]
    surrogate, clipped = clipped_surrogate(logp, old_logp, advantages, epsilon,
                                           epsilon if epsilon_high is None else epsilon_high)  # [n, T]
    policy = agg.numerator(surrogate, mask) / normalizer
    loss, kl_term, kl_sum = policy, 0.0, 0.0
    if beta > 0:
        if ref_logp is None:
            raise ValueError("grpo_loss: beta > 0 needs ref_logp")
        kl = KL_ESTIMATORS[kl_estimator](logp, ref_logp)         # [n, T]
        kl_share = beta * agg.numerator(kl, mask) / normalizer
        loss = loss + kl_share
        kl_term, kl_sum = float(kl_share.detach()), float((kl.detach() * mask).sum())
    return LossTerms(loss=loss, policy=float(policy.detach()), kl_term=kl_term, kl_sum=kl_sum,
                     clipped_sum=float((clipped.to(mask.dtype) * mask).sum()), tokens=float(mask.sum()))
