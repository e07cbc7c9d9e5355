"""Flow-GRPO's objective per (sample, step), from the shared pieces of grpo/algorithms/.

    A_i      = clip((r_i - mean_group r) / (std + eps_A), -adv_clip, adv_clip)        (group or global std)
    rho_ij   = exp(log pi_theta(x_{j+1} | x_j) - log pi_old(x_{j+1} | x_j))           (per SDE step j)
    L        = 1 / |M| sum_{(i, j) in M} [ max(-rho_ij A_i, -clip(rho_ij, 1 - eps, 1 + eps) A_i)
                                          + beta ||mu_theta - mu_ref||^2 / (2 sigma_j^2 h_j) ]

M is the set of trained (sample, step) pairs (flow.variant's plan); every step of a trajectory carries
the trajectory's advantage. The advantage is grpo.algorithms.advantages.grpo_advantages (flow.std:
group -> scale_rewards "group", global -> "batch"); the surrogate is
grpo.algorithms.loss.policy_surrogate and the mean over M is the "token-mean" aggregation
(grpo.algorithms.loss.AGGREGATIONS), with (sample, step) pairs in place of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.algorithms.advantages import grpo_advantages
from grpo.algorithms.loss import AGGREGATIONS, policy_surrogate

#: flow.std -> the scale_rewards entry of grpo.algorithms.advantages.REWARD_SCALES
STD_MODES = {"group": "group", "global": "batch"}


@dataclass
class FlowAdvantages:
    values: torch.Tensor     # [N] clipped advantages
    zero_std_groups: int
    num_groups: int
    clipped: int             # how many advantages the +-adv_clip bound changed


def flow_advantages(rewards: torch.Tensor, group_size: int, std: str = "group", eps: float = 1e-4,
                    adv_clip: float = 5.0) -> FlowAdvantages:
    """The group advantage of each trajectory, clipped to [-adv_clip, adv_clip].   Shape: [N] -> [N]"""
    if std not in STD_MODES:
        raise ValueError(f"flow.std must be one of {sorted(STD_MODES)}, got {std!r}")
    adv = grpo_advantages(rewards, group_size, eps, STD_MODES[std])
    clipped = adv.values.clamp(-adv_clip, adv_clip)
    return FlowAdvantages(clipped, adv.zero_std_groups, adv.num_groups, int((clipped != adv.values).sum()))


@dataclass
class FlowLossTerms:
    """A micro-batch's share of the step loss, and its statistics as one detached device tensor (``stats``:
    loss, policy share, KL sum, clipped pairs, pairs), summed by the update loop and read once per step; the
    named attributes read single values as floats."""

    loss: torch.Tensor       # scalar with grad: this micro-batch's share of the step loss
    stats: torch.Tensor      # [5] detached: loss, policy, kl_sum, clipped, pairs

    policy = property(lambda self: float(self.stats[1]), doc="share of the surrogate term")
    kl_sum = property(lambda self: float(self.stats[2]), doc="sum of the per-pair KL over the micro-batch")
    clipped = property(lambda self: float(self.stats[3]), doc="pairs whose ratio was clipped")
    pairs = property(lambda self: float(self.stats[4]), doc="pairs in the micro-batch")


def pair_normalizer(num_pairs: int, device: torch.device) -> float:
    """The token-mean normaliser over all trained (sample, step) pairs of the optimizer step."""
    mask = torch.ones(num_pairs, 1, device=device)
    return AGGREGATIONS["token-mean"].normalizer(mask, 1)


def flow_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, epsilon: float,
              normalizer: float, kl: torch.Tensor | None = None, beta: float = 0.0) -> FlowLossTerms:
    """The clipped surrogate (+ beta KL) of M (sample, step) pairs; shares sum to the step's mean.

    Shape: logp, old_logp, advantages [M] (kl [M] or None) -> FlowLossTerms
    """
    agg = AGGREGATIONS["token-mean"]
    mask = torch.ones_like(logp)[:, None]                                  # [M, 1]: every pair counts
    sur = policy_surrogate((logp - old_logp)[:, None], advantages, epsilon, epsilon)   # [M, 1]
    policy = agg.numerator(sur.loss, mask) / normalizer
    loss, kl_sum = policy, policy.new_zeros(())
    if kl is not None and beta > 0:
        loss = loss + beta * agg.numerator(kl[:, None], mask) / normalizer
    if kl is not None:
        kl_sum = kl.sum()
    count = torch.tensor(float(logp.numel()), dtype=policy.dtype, device=policy.device)
    stats = torch.stack([v.detach().to(policy.dtype) for v in (loss, policy, kl_sum, sur.clipped.sum(), count)])
    return FlowLossTerms(loss, stats)
