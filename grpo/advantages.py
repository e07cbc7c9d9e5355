"""Advantage estimators: pure functions from rewards to per-completion advantages.

Each estimator has the signature ``fn(rewards [N], group_size G, eps) -> Advantages`` with
rows ordered group by group (row i * G + g is completion g of prompt i). Variants are entries in
``ADVANTAGE_ESTIMATORS``, chosen by ``algorithm.advantage_estimator``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Advantages:
    values: torch.Tensor      # [N] advantage of each completion (same for all its tokens)
    zero_std_groups: int      # groups whose rewards all tie (their advantages are exactly 0)
    num_groups: int


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> Advantages:
    """Group-normalised reward (DeepSeekMath, eq. 3 / outcome supervision, section 4.1.2).

        A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

    ``std`` is the unbiased sample standard deviation over the G rewards of the group (as TRL).
    Groups whose rewards all tie get A = 0 exactly (never NaN) and are counted.

    Shape:
        rewards: [N] with N = B * G  ->  values: [N]
    """
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"grpo_advantages: rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    if group_size < 2:
        raise ValueError("grpo_advantages: group_size must be >= 2 (a group of one has no relative advantage)")
    r = rewards.float().view(-1, group_size)                  # [B, G]
    mean = r.mean(dim=1, keepdim=True)                         # [B, 1]
    std = r.std(dim=1, keepdim=True)                           # [B, 1] unbiased
    tied = (r == r[:, :1]).all(dim=1, keepdim=True)            # [B, 1] all rewards equal
    adv = torch.where(tied, torch.zeros_like(r), (r - mean) / (std + eps))  # [B, G]
    return Advantages(adv.reshape(-1), int(tied.sum()), r.shape[0])


AdvantageFn = Callable[[torch.Tensor, int, float], Advantages]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
}
