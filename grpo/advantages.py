"""Advantage estimators: pure functions from outcome rewards to per-completion advantages.

Every estimator has the signature ``fn(rewards [N], group_size G, eps) -> Advantages`` with rows
ordered group by group (row i * G + g is completion g of prompt i); the advantage of a completion is
given to each of its tokens. Variants are entries in ``ADVANTAGE_ESTIMATORS``, chosen by
``algorithm.advantage_estimator``. Groups whose rewards all tie carry no signal: their centred
advantage is exactly 0 (never NaN) and they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Advantages:
    values: torch.Tensor      # [N] advantage of each completion (same for all its tokens)
    zero_std_groups: int      # groups whose rewards all tie
    num_groups: int


def _groups(rewards: torch.Tensor, group_size: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards as [B, G] and a [B, 1] mask of tied groups; checks the shape."""
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{name}: rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    if group_size < 2:
        raise ValueError(f"{name}: group_size must be >= 2 (a group of one has no relative advantage)")
    r = rewards.float().view(-1, group_size)                  # [B, G]
    return r, (r == r[:, :1]).all(dim=1, keepdim=True)         # [B, G], [B, 1]


def _centred(r: torch.Tensor, tied: torch.Tensor) -> torch.Tensor:
    """r - mean(group), exactly 0 for tied groups.  Shape: [B, G] -> [B, G]."""
    return torch.where(tied, torch.zeros_like(r), r - r.mean(dim=1, keepdim=True))


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> Advantages:
    """Group-normalised reward (DeepSeekMath, eq. 3 with outcome supervision, section 4.1.2).

        A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

    ``std`` is the unbiased sample standard deviation of the G rewards of the group (as TRL).

    Shape:
        rewards: [N] with N = B * G  ->  values: [N]
    """
    r, tied = _groups(rewards, group_size, "grpo_advantages")
    scaled = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + eps)  # [B, G]
    adv = torch.where(tied, torch.zeros_like(r), scaled)                    # 0/0 never leaks out
    return Advantages(adv.reshape(-1), int(tied.sum()), r.shape[0])


def dr_grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> Advantages:
    """Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training"): no std division.

        A_i = r_i - mean(r_group)

    Shape: [N] -> [N]
    """
    r, tied = _groups(rewards, group_size, "dr_grpo_advantages")
    return Advantages(_centred(r, tied).reshape(-1), int(tied.sum()), r.shape[0])


def rloo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> Advantages:
    """RLOO (Ahmadian et al., 2024): baseline = mean of the other G - 1 rewards of the group.

        A_i = r_i - 1/(G-1) sum_{j != i} r_j  =  G/(G-1) * (r_i - mean(r_group))

    Shape: [N] -> [N]
    """
    r, tied = _groups(rewards, group_size, "rloo_advantages")
    G = group_size
    loo_mean = (r.sum(dim=1, keepdim=True) - r) / (G - 1)                   # [B, G] mean of the others
    adv = torch.where(tied, torch.zeros_like(r), r - loo_mean)              # [B, G]
    return Advantages(adv.reshape(-1), int(tied.sum()), r.shape[0])


def reinforce_pp_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> Advantages:
    """REINFORCE++ with a group baseline (Hu, 2025): subtract the group mean, then whiten the
    result over the whole batch.

        a_i = r_i - mean(r_group);   A_i = (a_i - mean(a)) / (std(a) + eps)   over all N

    Shape: [N] -> [N]
    """
    r, tied = _groups(rewards, group_size, "reinforce_pp_advantages")
    a = _centred(r, tied).reshape(-1)                                       # [N]
    if a.numel() < 2 or bool((a == a[0]).all()):
        return Advantages(torch.zeros_like(a), int(tied.sum()), r.shape[0])  # nothing to whiten
    return Advantages((a - a.mean()) / (a.std() + eps), int(tied.sum()), r.shape[0])


AdvantageFn = Callable[[torch.Tensor, int, float], Advantages]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}
