"""The per-token policy term of the loss, one registry entry per formulation (``algorithm.policy_loss``).

Every entry maps (log_ratio [n, T], logp [n, T], token_log_ratio [n, T], advantages [n] or [n, T], mask [n, T],
params) to a :class:`Surrogate` of [n, T] tensors, the loss to minimise per token before the aggregation.
``log_ratio`` is the importance ratio at the configured level (grpo.algorithms.loss.IMPORTANCE_RATIOS: token,
sequence, trajectory), ``token_log_ratio`` the plain per-token log pi_theta - log pi_old. With
r = exp(log_ratio) and A the advantage:

* ``clip``   PPO / GRPO (DeepSeekMath eq. 3): max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A), with the
             optional dual clip (Ye et al. 2020, -c A caps A < 0) and INTELLECT-2's delta (arXiv 2505.07291:
             r <= delta in the unclipped branch, a two-sided clip for A < 0).
* ``cispo``  CISPO (MiniMax-M1, arXiv 2506.13585): -sg(min(r, cap)) A log pi_theta; the weight is clipped,
             never the gradient, so every token keeps its gradient (ScaleRL's eps_max = cap).
* ``sapo``   SAPO (Gao et al., arXiv 2511.20347): -(4 / tau) sigmoid(tau (r - 1)) A, tau = tau_pos for A > 0
             and tau_neg otherwise: a soft gate whose gradient is A at r = 1 and fades off-policy.
* ``vespo``  VESPO (arXiv 2602.10693, as TRL 1.16 implements it): -sg(phi(w)) A log pi_theta with
             w = exp(sum_t log r_t) the sequence ratio and phi(w) = exp(lambda + k log w - lambda w) (phi(1) = 1),
             (k, lambda) = (k_pos, lambda_pos) for A >= 0 and (k_neg, lambda_neg) otherwise.

``Surrogate.clipped`` marks the tokens whose gradient the formulation cut or capped (clip: the clipped side
of the min; cispo: r > cap with A > 0, as TRL counts it; sapo and vespo: none).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from grpo.algorithms.params import param, require


class Surrogate(NamedTuple):
    loss: torch.Tensor          # [n, T] per-token policy loss
    clipped: torch.Tensor       # [n, T] bool, the clipped side of the PPO min was taken (zero gradient)
    dual_clipped: torch.Tensor  # [n, T] bool, the dual-clip cap -c * A was taken (zero gradient)


@dataclass(frozen=True)
class PolicyLossParams:
    """The constants of every formulation (each reads its own)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    clip_ratio_c: float | None = None      # dual clip c > 1 (clip)
    clip_delta: float | None = None        # INTELLECT-2 delta (clip)
    cispo_max: float = 5.0                 # cap of CISPO's weight
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    @classmethod
    def of_entry(cls, name: str, params: Any) -> "PolicyLossParams":
        """The constants of entry `name` from its declared parameters (POLICY_LOSS_PARAMS): parameter p of
        entry e is the field e_p here (sapo's tau_pos -> sapo_tau_pos); the others keep their defaults
        (grpo_loss sets eps_low / eps_high / clip_ratio_c from its own arguments)."""
        return cls(**{f"{name}_{f.name}": getattr(params, f.name) for f in dataclasses.fields(params)})


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages [n] (one per completion) or [n, T] (one per token) as something broadcasting to [n, T]."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def _none(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like, dtype=torch.bool)


def clip_surrogate(log_ratio, logp, token_log_ratio, advantages, mask, p: PolicyLossParams) -> Surrogate:
    """PPO's clipped surrogate, negated to a loss, per token, with the optional dual clip and delta.

        l_it = max(-min(r_it, delta) A_it, -clip(r_it, 1 - eps_low, 1 + eps_high) A_it)
        l_it = min(l_it, -c A_it)   where A_it < 0                 (dual clip, Ye et al. 2020; c > 1)

    Shape: log_ratio [n, T], advantages [n] or [n, T] -> Surrogate of [n, T] tensors
    """
    ratio = torch.exp(log_ratio)                                # [n, T]
    adv = _per_token(advantages)                                # [n, 1] or [n, T]
    unclipped = -(ratio if p.clip_delta is None else torch.clamp(ratio, max=p.clip_delta)) * adv
    clipped = -torch.clamp(ratio, 1.0 - p.eps_low, 1.0 + p.eps_high) * adv
    loss = torch.maximum(unclipped, clipped)                    # [n, T]
    is_clipped = clipped > unclipped                            # max picked the clipped side
    if p.clip_ratio_c is None:
        return Surrogate(loss, is_clipped, _none(is_clipped))
    cap = -p.clip_ratio_c * adv
    is_dual = (adv < 0) & (loss > cap)                          # [n, T]
    return Surrogate(torch.where(is_dual, cap, loss), is_clipped & ~is_dual, is_dual)


def cispo_surrogate(log_ratio, logp, token_log_ratio, advantages, mask, p: PolicyLossParams) -> Surrogate:
    """CISPO: l_it = -sg(min(r_it, cispo_max)) A_it log pi_theta(o_it); d l / d logp_it = -min(r, cap) A.

    Shape: log_ratio, logp [n, T], advantages [n] or [n, T] -> Surrogate of [n, T] tensors
    """
    ratio = torch.exp(log_ratio.detach())                       # [n, T]
    adv = _per_token(advantages)
    weight = torch.clamp(ratio, max=p.cispo_max)
    loss = -weight * adv * logp                                 # [n, T]
    return Surrogate(loss, (ratio > p.cispo_max) & (adv > 0), _none(loss))


def sapo_surrogate(log_ratio, logp, token_log_ratio, advantages, mask, p: PolicyLossParams) -> Surrogate:
    """SAPO: l_it = -(4 / tau_it) sigmoid(tau_it (r_it - 1)) A_it, tau_it = tau_pos if A_it > 0 else tau_neg.

    d l / d r = -4 s (1 - s) A with s = sigmoid(tau (r - 1)): -A at r = 1 (GRPO's on-policy gradient), fading
    smoothly as r leaves 1 (faster for larger tau).

    Shape: log_ratio [n, T], advantages [n] or [n, T] -> Surrogate of [n, T] tensors
    """
    ratio = torch.exp(log_ratio)                                # [n, T]
    adv = _per_token(advantages)
    tau = torch.where(adv > 0, p.sapo_tau_pos, p.sapo_tau_neg).to(ratio.dtype)   # [n, 1] or [n, T]
    loss = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv
    return Surrogate(loss, _none(loss), _none(loss))


def vespo_weights(token_log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  p: PolicyLossParams) -> torch.Tensor:
    """VESPO's gamma weight of each completion: phi(w) = exp(lambda + k log w - lambda w), w = exp(sum_t log r_t)
    with the per-token log ratios clamped to [-20, 20] and log w to [log 1e-8, 20] (TRL 1.16's guards);
    (k, lambda) by the sign of the completion's advantage (A >= 0: pos). No gradient.

    Shape: token_log_ratio, mask [n, T], advantages [n] or [n, T] (the first token's) -> [n, 1]
    """
    m = mask.to(token_log_ratio.dtype)
    log_w = (token_log_ratio.detach().clamp(-20.0, 20.0) * m).sum(dim=1, keepdim=True)   # [n, 1]
    log_w = log_w.clamp(math.log(1e-8), 20.0)
    adv = _per_token(advantages)[:, :1]                         # [n, 1]
    k = torch.where(adv >= 0, p.vespo_k_pos, p.vespo_k_neg).to(log_w.dtype)
    lam = torch.where(adv >= 0, p.vespo_lambda_pos, p.vespo_lambda_neg).to(log_w.dtype)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)


def vespo_surrogate(log_ratio, logp, token_log_ratio, advantages, mask, p: PolicyLossParams) -> Surrogate:
    """VESPO: l_it = -phi_i A_it log pi_theta(o_it) with phi_i = :func:`vespo_weights` (detached).

    Shape: logp, token_log_ratio, mask [n, T], advantages [n] or [n, T] -> Surrogate of [n, T] tensors
    """
    phi = vespo_weights(token_log_ratio, advantages, mask, p)   # [n, 1]
    loss = -phi * _per_token(advantages) * logp                 # [n, T]
    return Surrogate(loss, _none(loss), _none(loss))


PolicyLossFn = Callable[..., Surrogate]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "clip": clip_surrogate,
    "cispo": cispo_surrogate,
    "sapo": sapo_surrogate,
    "vespo": vespo_surrogate,
}


# ---------------------------------------------------------------- each entry's parameters (algorithm.policy_loss)


@dataclass(frozen=True)
class ClipParams:
    ratio_c: float | None = param(None, "Dual-clip constant c > 1 (verl clip_ratio_c, e.g. 3.0): caps the loss of "
                                  "A < 0 tokens at -c * A; empty = off.")
    delta: float | None = param(None, "INTELLECT-2's delta > 1 + epsilon_high (TRL delta): the unclipped ratio is "
                                "capped at delta too, a two-sided clip for A < 0; empty = off.")

    def __post_init__(self) -> None:
        require(self.ratio_c is None or self.ratio_c > 1, "ratio_c must be > 1 (or empty)")
        require(self.delta is None or self.delta > 1, "delta must be > 1 (or empty)")


@dataclass(frozen=True)
class CispoParams:
    max: float = param(5.0, "The importance weight is min(r, max) (ScaleRL's eps_max; TRL's epsilon_high under "
                       "loss_type cispo).")

    def __post_init__(self) -> None:
        require(self.max > 0, "max must be > 0")


@dataclass(frozen=True)
class SapoParams:
    tau_pos: float = param(1.0, "Gate temperature for A > 0.")
    tau_neg: float = param(1.05, "Gate temperature for A <= 0 (the paper: > tau_pos).")

    def __post_init__(self) -> None:
        require(self.tau_pos > 0 and self.tau_neg > 0, "tau_pos and tau_neg must be > 0")


@dataclass(frozen=True)
class VespoParams:
    k_pos: float = param(2.0, "phi(w) = exp(lambda + k log w - lambda w): k for A >= 0.")
    lambda_pos: float = param(3.0, "lambda for A >= 0.")
    k_neg: float = param(3.0, "k for A < 0.")
    lambda_neg: float = param(2.0, "lambda for A < 0.")

    def __post_init__(self) -> None:
        require(min(self.k_pos, self.k_neg) >= 0 and min(self.lambda_pos, self.lambda_neg) > 0,
                "k_pos, k_neg must be >= 0 and lambda_pos, lambda_neg > 0")


POLICY_LOSS_PARAMS: dict[str, type] = {"clip": ClipParams, "cispo": CispoParams, "sapo": SapoParams,
                                       "vespo": VespoParams}
