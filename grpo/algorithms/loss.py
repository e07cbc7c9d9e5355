"""The GRPO objective as small pure functions (tensors in, tensors out).

DeepSeekMath (Shao et al., 2024), eq. 3, written as a loss to minimise:

    L = 1/N sum_i 1/|o_i| sum_t [ -min(rho_it A_it, clip(rho_it, 1-eps_low, 1+eps_high) A_it)
                                  + beta * D_KL(pi_theta || pi_ref)_it ]  -  c_H * H
    rho_it = exp(log pi_theta(o_it) - log pi_old(o_it))
    D_KL ~ k3 = exp(ref - logp) - (ref - logp) - 1          (Schulman, "Approximating KL", 2020)

A_it = A_i for outcome supervision, or a per-token advantage (process supervision). Optional parts:
dual clip (Ye et al., 2020) caps the loss of negative-advantage tokens at -c * A; an entropy bonus
c_H * H uses the same aggregation as the policy term.

Variants are registry entries: ``KL_ESTIMATORS`` (``algorithm.kl_estimator``), ``AGGREGATIONS``
(``algorithm.loss_agg_mode``), ``IMPORTANCE_RATIOS`` (``algorithm.importance_sampling_level``) and
``POLICY_LOSSES`` (``algorithm.policy_loss``, grpo/algorithms/policy_losses.py: clip, CISPO, SAPO, VESPO).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from grpo.algorithms.policy_losses import POLICY_LOSSES, PolicyLossParams, Surrogate, clip_surrogate
from grpo.algorithms.stabilisers import unbiased_kl

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

# ---------------------------------------------------------------- importance ratio level


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PPO / GRPO per-token ratio: log rho_it = logp_it - old_it.  Shape: [n, T] -> [n, T]."""
    return logp - old_logp


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO (Zheng et al., 2025), in its token-level gradient form GSPO-token:

        log s_i  = 1/|o_i| sum_t (logp_it - old_it)           (length-normalised sequence ratio)
        log s_it = sg[log s_i] + logp_it - sg[logp_it]

    The value is log s_i on every token; the gradient w.r.t. logp_it is 1 (times s_it once
    exponentiated), so with equal per-token advantages the gradient equals GSPO's sequence objective.

    Shape: logp, old_logp, mask [n, T] -> [n, T]
    """
    mask = mask.to(logp.dtype)
    log_s = ((logp - old_logp) * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return log_s.detach() + logp - logp.detach()                # [n, T]


def trajectory_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TIC-GRPO (Pang et al., arXiv 2508.02833): one trajectory-level probability ratio per completion,

        log w_i  = log pi_theta(o_i|q) - log pi_old(o_i|q) = sum_t (logp_it - old_it)   (no 1/|o_i|)
        log w_it = sg[log w_i] + logp_it - sg[logp_it]

    The value is log w_i on every token; d/d logp_it = 1, so once exponentiated each token carries
    w_i * grad log pi(o_it) and a token-sum aggregation gives w_i * A_i * grad log pi_theta(o_i|q): an
    importance-sampled estimate of the gradient at the *current* policy from samples of pi_old (GRPO's
    per-token ratios estimate it at pi_old). Clip it as any ratio (``epsilon_high``; ``epsilon`` >= 1
    leaves the lower side open).

    Shape: logp, old_logp, mask [n, T] -> [n, T]
    """
    mask = mask.to(logp.dtype)
    log_w = ((logp - old_logp) * mask).sum(dim=1, keepdim=True)          # [n, 1]
    return log_w.detach() + logp - logp.detach()                # [n, T]


IMPORTANCE_RATIOS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
    "trajectory": trajectory_log_ratio,     # TIC-GRPO
}

# ---------------------------------------------------------------- clipped surrogate


def policy_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float,
                     clip_ratio_c: float | None = None) -> Surrogate:
    """PPO's clipped surrogate with the optional dual clip: ``POLICY_LOSSES["clip"]``
    (grpo/algorithms/policy_losses.py) with these constants.  Shape: [n, T] -> Surrogate of [n, T]."""
    params = PolicyLossParams(eps_low=eps_low, eps_high=eps_high, clip_ratio_c=clip_ratio_c)
    return clip_surrogate(log_ratio, None, log_ratio, advantages, None, params)


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


def logprob_gap_sums(logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t |log pi(o_t) - log pi_sampler(o_t)| and the token count over `mask`, on the tensors' device
    (no host sync; :func:`logprob_gap` is their ratio). Shape: [n, T] x3 -> [2] float32."""
    m = mask.to(torch.float32)
    return torch.stack([((logp.detach().float() - sampled.float()).abs() * m).sum(), m.sum()])


def logprob_gap(logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> float:
    """Training-inference mismatch: mean |log pi(o_t) - log pi_sampler(o_t)| over the tokens of `mask`,
    the same policy's log-probs from the training forward and from the rollout (0 up to numerics; bf16
    rollouts or a different kernel show here). Shape: [n, T] x3 -> float (NaN without tokens)."""
    total, count = logprob_gap_sums(logp, sampled, mask).tolist()
    return total / count if count else float("nan")


# ---------------------------------------------------------------- the full objective


# The statistics of one micro-batch's loss, in the order of ``LossTerms.stats``:
LOSS_STATS = (
    "loss",              # the micro-batch's share of the step loss (detached)
    "policy",            # share of the policy (surrogate) term
    "kl_term",           # share of the beta * KL term
    "kl_sum",            # sum of per-token KL over active tokens (for the mean KL metric)
    "clipped_sum",       # active tokens whose ratio was clipped (PPO clip)
    "tokens",            # active tokens in this micro-batch
    "dual_clipped_sum",  # active tokens capped by the dual clip (A < 0, ratio > c)
    "entropy_term",      # share of the -entropy_coef * H term (<= 0: it lowers the loss)
    "clipped_high_sum",  # of clipped_sum, tokens clipped at 1 + eps_high (ratio > 1; the rest at 1 - eps_low)
)


def _stat(index: int) -> property:
    return property(lambda self: float(self.stats[index]), doc=f"``float(stats[{index}])`` (one host sync)")


@dataclass
class LossTerms:
    """One micro-batch's share of the step loss, and its statistics as one detached device tensor, so a
    training loop can add them up over micro-batches and read them once per step (one host sync, not one
    per statistic and micro-batch). The named attributes (``terms.policy``, ``terms.tokens``, ...) read
    single values as floats."""

    loss: torch.Tensor          # scalar with grad; the micro-batch shares add up to the step loss
    stats: torch.Tensor         # [len(LOSS_STATS)] detached, on the loss's device (float32; float64 inputs: float64)


for _i, _name in enumerate(LOSS_STATS[1:], start=1):      # stats[0] is `loss` detached: no float alias
    setattr(LossTerms, _name, _stat(_i))


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, epsilon: float, epsilon_high: float | None,
              beta: float, kl_estimator: str = "k3", agg_mode: str = "seq-mean-token-mean",
              normalizer: float, importance_sampling_level: str = "token", clip_ratio_c: float | None = None,
              entropy: torch.Tensor | None = None, entropy_coef: float = 0.0, kl_ratio_correction: bool = False,
              policy_weight: torch.Tensor | None = None, policy_loss: str = "clip",
              policy_params: PolicyLossParams | None = None) -> LossTerms:
    """GRPO loss of a micro-batch (see module docstring).

    ``normalizer`` comes from ``AGGREGATIONS[agg_mode].normalizer(mask_of_whole_step, L)``; the KL
    and entropy terms use the same aggregation and normaliser as the policy term. ``entropy`` must
    carry autograd when ``entropy_coef > 0``. ``beta`` is a float or one value per row ([n], the
    per-domain beta of grpo.algorithms.stabilisers.domain_betas). ``kl_ratio_correction``: the KL
    estimate times the importance ratio (DeepSeek-V3.2's unbiased KL, grpo.algorithms.stabilisers).
    ``policy_weight`` ([n, 1] or [n, T], detached): multiplies the per-token policy loss before the
    aggregation (off-policy sequence mask, TIS / MIS weights), as TRL multiplies ``per_token_loss``.
    ``policy_loss`` names the per-token policy term (grpo/algorithms/policy_losses.py: clip, cispo, sapo,
    vespo); ``policy_params`` carries its constants, ``epsilon`` / ``epsilon_high`` / ``clip_ratio_c``
    overriding theirs.

    Shape:
        logp, old_logp, ref_logp, mask, entropy: [n, T]; advantages: [n] or [n, T]  ->  scalar loss
    """
    mask = mask.to(logp.dtype)
    agg = AGGREGATIONS[agg_mode]
    log_ratio = IMPORTANCE_RATIOS[importance_sampling_level](logp, old_logp, mask)   # [n, T]
    params = dataclasses.replace(policy_params or PolicyLossParams(), eps_low=epsilon, clip_ratio_c=clip_ratio_c,
                                 eps_high=epsilon if epsilon_high is None else epsilon_high)
    sur = POLICY_LOSSES[policy_loss](log_ratio, logp, logp - old_logp, advantages, mask, params)
    per_token = sur.loss if policy_weight is None else sur.loss * policy_weight      # [n, T]
    policy = agg.numerator(per_token, mask) / normalizer
    zero = policy.new_zeros(())
    loss, kl_term, kl_sum, entropy_term = policy, zero, zero, zero
    if isinstance(beta, torch.Tensor):                                              # [n] per row
        with_kl = bool((beta > 0).any())
    else:                                                                           # a float: no device sync
        with_kl = (max(beta) if isinstance(beta, (list, tuple)) else beta) > 0
    if with_kl:
        row_beta = torch.as_tensor(beta, dtype=logp.dtype, device=logp.device)      # [] or [n]
        if ref_logp is None:
            raise ValueError("grpo_loss: beta > 0 needs ref_logp")
        kl = KL_ESTIMATORS[kl_estimator](logp, ref_logp)         # [n, T]
        if kl_ratio_correction:                                  # DeepSeek-V3.2 eq. 7 (TRL use_bias_correction_kl)
            kl = unbiased_kl(kl, logp, old_logp, mask, importance_sampling_level)
        weighted = kl * (row_beta.unsqueeze(1) if row_beta.dim() == 1 else row_beta)  # beta per row or scalar
        kl_share = agg.numerator(weighted, mask) / normalizer
        loss = loss + kl_share
        kl_term, kl_sum = kl_share, (kl * mask).sum()
    if entropy_coef != 0:
        if entropy is None:
            raise ValueError("grpo_loss: entropy_coef != 0 needs the entropy (with autograd)")
        ent_share = -entropy_coef * agg.numerator(entropy, mask) / normalizer
        loss = loss + ent_share
        entropy_term = ent_share
    dtype = torch.promote_types(logp.dtype, torch.float32)          # counts exact past bf16's 256; float64 stays
    wide_mask = mask.to(dtype)
    count = lambda b: (b.to(dtype) * wide_mask).sum()  # noqa: E731
    stats = torch.stack([v.detach().to(dtype) for v in (
        loss, policy, kl_term, kl_sum, count(sur.clipped), wide_mask.sum(), count(sur.dual_clipped), entropy_term,
        count(sur.clipped & (log_ratio > 0)))])
    return LossTerms(loss=loss, stats=stats)
