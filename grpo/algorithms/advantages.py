"""Advantage estimators and reward combiners: pure functions from outcome rewards to advantages.

Every estimator has the signature ``fn(rewards [N], group_size G, eps, scale_rewards="group") ->
Advantages`` with rows ordered group by group (row i * G + g is completion g of prompt i); the
advantage of a completion is given to each of its tokens. Variants are entries in
``ADVANTAGE_ESTIMATORS``, chosen with their parameters (``ADVANTAGE_PARAMS``) by the variant key
``algorithm.advantage: {name: grpo, eps: 1e-4, scale_rewards: group}``.

Missing rewards: a NaN reward means "no reward for this completion" (every reward function returned
None). Such rows get advantage exactly 0 and are left out of every mean and std (of their group and
of the batch). A group with fewer than 2 finite rewards, or whose finite rewards all tie, carries no
signal: it is a *zero-std group*, its centred advantages are exactly 0 (never NaN) and it is counted.

Several reward functions are first combined into one total per completion by a ``REWARD_COMBINERS``
entry (``algorithm.reward_combination``); the estimator is then applied to that total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from grpo.algorithms.params import param, require


@dataclass
class Advantages:
    values: torch.Tensor      # [N] advantage of each completion (same for all its tokens)
    zero_std_groups: int      # groups whose finite rewards all tie, or with fewer than 2 of them
    num_groups: int

# ---------------------------------------------------------------- group statistics over finite entries


class GroupStats(NamedTuple):
    """Statistics of the finite entries along the last dim (the G completions of a group)."""

    finite: torch.Tensor      # [..., G] bool, the entries that count
    mean: torch.Tensor        # [..., 1] mean of the finite entries (0 when there are none)
    std: torch.Tensor         # [..., 1] unbiased std of the finite entries (0 when fewer than 2)
    degenerate: torch.Tensor  # [..., 1] bool: fewer than 2 finite entries, or all of them tie


def group_stats(r: torch.Tensor) -> GroupStats:
    """Mean, unbiased std and degeneracy over the finite entries of the last dim, NaN-free.

        mean = 1/n sum_{g finite} r_g;   std = sqrt(1/(n-1) sum_{g finite} (r_g - mean)^2)

    Shape: [..., G] -> GroupStats of [..., G] / [..., 1] tensors
    """
    finite = torch.isfinite(r)
    n = finite.sum(dim=-1, keepdim=True)                                    # [..., 1]
    mean = torch.where(finite, r, 0).sum(dim=-1, keepdim=True) / n.clamp(min=1)
    dev = torch.where(finite, r - mean, 0)                                  # [..., G]
    std = ((dev ** 2).sum(dim=-1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    hi = torch.where(finite, r, -torch.inf).amax(dim=-1, keepdim=True)
    lo = torch.where(finite, r, torch.inf).amin(dim=-1, keepdim=True)
    return GroupStats(finite, mean, std, (n < 2) | (hi == lo))


def group_normalise(r: torch.Tensor, eps: float) -> torch.Tensor:
    """(r - mean) / (std + eps) within each group over its finite entries; exactly 0 for non-finite
    entries and for degenerate groups.  Shape: [..., G] -> [..., G]."""
    s = group_stats(r)
    return torch.where(s.finite & ~s.degenerate, (r - s.mean) / (s.std + eps), 0)


def _groups(rewards: torch.Tensor, group_size: int, name: str) -> tuple[torch.Tensor, GroupStats]:
    """Rewards as [B, G] (floating, dtype kept) and their group statistics; checks the shape."""
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{name}: rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    if group_size < 2:
        raise ValueError(f"{name}: group_size must be >= 2 (a group of one has no relative advantage)")
    r = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)  # [B, G]
    return r, group_stats(r)


def _centred(r: torch.Tensor, s: GroupStats) -> torch.Tensor:
    """r - mean(group) on finite entries of informative groups, exactly 0 elsewhere.  [B, G] -> [B, G]."""
    return torch.where(s.finite & ~s.degenerate, r - s.mean, 0)


def _result(values: torch.Tensor, s: GroupStats) -> Advantages:
    return Advantages(values.reshape(-1), int(s.degenerate.sum()), s.degenerate.shape[0])

# ---------------------------------------------------------------- reward scaling (grpo's std division)
# Each entry maps (rewards [B, G], their GroupStats, eps) to the divisor of the centred reward.


def _batch_std(r: torch.Tensor, s: GroupStats) -> torch.Tensor:
    """Unbiased std of every finite reward of the batch (0 when fewer than 2).  [B, G] -> []."""
    flat = r[s.finite]
    return flat.std() if flat.numel() >= 2 else r.new_zeros(())


REWARD_SCALES: dict[str, Callable[[torch.Tensor, GroupStats, float], torch.Tensor]] = {
    "group": lambda r, s, eps: s.std + eps,                 # DeepSeekMath / TRL default
    "batch": lambda r, s, eps: _batch_std(r, s) + eps,      # TRL scale_rewards="batch"; GDPO's batch step
    "none": lambda r, s, eps: torch.ones_like(s.std),       # Dr. GRPO / TRL scale_rewards="none"
}

# ---------------------------------------------------------------- estimators


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4,
                    scale_rewards: str = "group") -> Advantages:
    """Group-normalised reward (DeepSeekMath, eq. 3 with outcome supervision, section 4.1.2).

        A_i = (r_i - mean(r_group)) / (std + eps)

    ``scale_rewards`` (as TRL's ``GRPOConfig.scale_rewards``, registry ``REWARD_SCALES``) picks the
    std: ``group`` = the unbiased std of the group's finite rewards, ``batch`` = the unbiased std of
    all finite rewards of the batch, ``none`` = no division at all (A_i = r_i - mean(r_group)).

    Shape:
        rewards: [N] with N = B * G  ->  values: [N]
    """
    r, s = _groups(rewards, group_size, "grpo_advantages")
    divisor = REWARD_SCALES[scale_rewards](r, s, eps)
    centred = _centred(r, s)                                                # [B, G]
    return _result(torch.where(centred != 0, centred / divisor, 0), s)      # 0/0 never leaks out


def dr_grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4,
                       scale_rewards: str = "none") -> Advantages:
    """Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training"): no std division.

        A_i = r_i - mean(r_group)

    The registry name ``dr_grpo`` is an alias: this is :func:`grpo_advantages` with
    ``scale_rewards="none"`` (the one implementation), so ``algorithm.advantage: dr_grpo`` takes no
    ``scale_rewards`` parameter.

    Shape: [N] -> [N]
    """
    return grpo_advantages(rewards, group_size, eps, "none")


def rloo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4,
                    scale_rewards: str = "group") -> Advantages:
    """RLOO (Ahmadian et al., 2024): baseline = mean of the other finite rewards of the group.

        A_i = r_i - 1/(n-1) sum_{j != i} r_j  =  n/(n-1) * (r_i - mean(r_group))

    with n the number of finite rewards of the group (n = G without missing rewards).
    ``scale_rewards`` is ignored: RLOO's baseline is unscaled by definition.

    Shape: [N] -> [N]
    """
    r, s = _groups(rewards, group_size, "rloo_advantages")
    n = s.finite.sum(dim=1, keepdim=True)                                   # [B, 1]
    return _result(_centred(r, s) * n / (n - 1).clamp(min=1), s)


def reinforce_pp_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4,
                            scale_rewards: str = "group") -> Advantages:
    """REINFORCE++ with a group baseline (Hu, 2025): subtract the group mean, then whiten the
    result over the whole batch.

        a_i = r_i - mean(r_group);   A_i = (a_i - mean(a)) / (std(a) + eps)   over the finite rows

    As in verl, rows of zero-std groups (a_i = 0) take part in the whitening, so after it they need
    not be 0; rows with a NaN reward are left out of it and stay exactly 0. ``scale_rewards`` is
    ignored: the batch whitening is the estimator's own scaling.

    Shape: [N] -> [N]
    """
    r, s = _groups(rewards, group_size, "reinforce_pp_advantages")
    a, finite = _centred(r, s).reshape(-1), s.finite.reshape(-1)            # [N], [N]
    live = a[finite]
    if live.numel() < 2 or bool((live == live[0]).all()):
        return _result(torch.zeros_like(a), s)                              # nothing to whiten
    return _result(torch.where(finite, (a - live.mean()) / (live.std() + eps), 0), s)


AdvantageFn = Callable[..., Advantages]   # (rewards [N], G, eps, scale_rewards="group") -> Advantages

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}

# ---------------------------------------------------------------- each entry's parameters (algorithm.advantage)


@dataclass(frozen=True)
class EpsParams:
    eps: float = param(1e-4, "eps of the std divisions: the estimator's (grpo: std + eps, reinforce_pp: the batch "
                       "whitening) and, whichever estimator, reward_combination normalize_then_sum, process and "
                       "per-turn advantages, entropy-shaped advantages and the critic's.")

    def __post_init__(self) -> None:
        require(self.eps >= 0, "eps must be >= 0")


@dataclass(frozen=True)
class GrpoAdvantageParams(EpsParams):
    scale_rewards: str = param("group", "The std A is divided by (as TRL's scale_rewards): group | batch | none "
                               "(no division; = dr_grpo).")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.scale_rewards in REWARD_SCALES,
                f"scale_rewards must be one of {sorted(REWARD_SCALES)}, got {self.scale_rewards!r}")


#: Every entry declares eps: the stages around the estimator (see EpsParams) compute with it under any entry.
#: scale_rewards belongs to grpo alone: dr_grpo is grpo with none, rloo and reinforce_pp do not scale by a std.
ADVANTAGE_PARAMS: dict[str, type] = {"grpo": GrpoAdvantageParams, "dr_grpo": EpsParams, "rloo": EpsParams,
                                     "reinforce_pp": EpsParams}


def estimate_advantages(advantage: Any, rewards: torch.Tensor, group_size: int) -> Advantages:
    """The advantages of `advantage` (the config's Variant: name and ADVANTAGE_PARAMS instance); the entries
    without scale_rewards ignore the argument (dr_grpo divides by nothing, rloo and reinforce_pp by no group std).
    [N] -> [N]."""
    scale = getattr(advantage.params, "scale_rewards", "group")
    return ADVANTAGE_ESTIMATORS[advantage.name](rewards, group_size, advantage.params.eps, scale)

# ---------------------------------------------------------------- multi-objective reward combination


def weighted_nansum(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k w_k v_ik over the finite v_ik of each row; NaN for a row with none.  [N, R] -> [N]."""
    finite = torch.isfinite(values)
    total = torch.where(finite, values * weights.to(values), 0).sum(dim=1)
    return torch.where(finite.any(dim=1), total, torch.nan)


def sum_then_normalize(per_function: torch.Tensor, weights: torch.Tensor, group_size: int,
                       eps: float = 1e-4) -> torch.Tensor:
    """The weighted sum of the rewards that applied (the advantage estimator normalises it).

        r_i = sum_{k: r_ik not None} w_k r_ik          (NaN when no reward function applied)

    Shape: per_function [N, R], weights [R] -> [N]
    """
    return weighted_nansum(per_function, weights)


def normalize_then_sum(per_function: torch.Tensor, weights: torch.Tensor, group_size: int,
                       eps: float = 1e-4) -> torch.Tensor:
    """MO-GRPO / GDPO: normalise each reward function within its group, then take the weighted sum.

        r~_ik = (r_ik - mean_group(r_k)) / (std_group(r_k) + eps);   r_i = sum_k w_k r~_ik

    Means and (unbiased) stds are over the finite entries of the group's column; a column that ties
    within a group (or has fewer than 2 finite entries there) gives 0; NaN entries stay excluded from
    the sum; a row with no finite entry gives NaN. Applying ``grpo`` with ``scale_rewards="batch"``
    to this total is GDPO's batch normalisation.

    Shape: per_function [N, R], weights [R] -> [N]
    """
    N, R = per_function.shape
    if N % group_size != 0:
        raise ValueError(f"normalize_then_sum: {N} rows do not split into groups of {group_size}")
    cols = per_function.T.reshape(R, -1, group_size)                        # [R, B, G]
    normed = group_normalise(cols, eps).reshape(R, N).T                     # [N, R]
    normed = torch.where(torch.isfinite(per_function), normed, torch.nan)   # keep "no reward" visible
    return weighted_nansum(normed, weights)


REWARD_COMBINERS: dict[str, Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]] = {
    "sum_then_normalize": sum_then_normalize,
    "normalize_then_sum": normalize_then_sum,
}
