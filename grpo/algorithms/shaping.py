"""Reward and sample shaping used by the trainer: pure functions (tensors/lists in, tensors out).

Rows are ordered group by group (row i * G + g is completion g of prompt i), as in
``grpo.algorithms.advantages``; a NaN reward means "no reward for this completion".

* ``informative_groups``       DAPO dynamic sampling (Yu et al., 2025): keep groups whose rewards differ.
* ``gfpo_select``              GFPO (Shrivastava et al., 2025): sample k > G, keep the G best by a metric.
* ``overlong_keep``            DAPO overlong filtering: truncated completions leave the loss.
* ``soft_overlong_penalty``    DAPO soft overlong punishment (eq. 13).
* ``kl_in_reward``             KL penalty in the reward instead of the loss (verl ``use_kl_in_reward``).
* ``top_entropy_mask``         train on the top-rho highest-entropy tokens (Wang et al., 2025).
* ``token_step_ids``, ``process_advantages``   process supervision (DeepSeekMath section 4.1.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from grpo.algorithms.advantages import group_normalise, group_stats
from grpo.algorithms.params import param, require


def _check_groups(n: int, group_size: int, name: str) -> None:
    if group_size < 1 or n % group_size != 0:
        raise ValueError(f"{name}: {n} rows do not split into groups of {group_size}")

# ---------------------------------------------------------------- DAPO dynamic sampling


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """True for groups with at least 2 finite rewards that do not all tie (the groups with a
    non-zero advantage; the zero-std groups of ``grpo.algorithms.advantages`` are False).

    Shape: rewards [N] with N = B * G  ->  [B] bool
    """
    _check_groups(rewards.numel(), group_size, "informative_groups")
    r = rewards if rewards.is_floating_point() else rewards.float()
    return ~group_stats(r.view(-1, group_size)).degenerate.squeeze(1)

# ---------------------------------------------------------------- GFPO: group filtering
# Each metric maps (rewards [B, k], lengths [B, k]) to a score; the G highest scores are kept.


def _token_efficiency(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """reward / length (higher is better); a completion without reward ranks last."""
    score = rewards / lengths.to(rewards.dtype).clamp(min=1)
    return torch.where(torch.isfinite(score), score, -torch.inf)


GFPO_METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "length": lambda rewards, lengths: -lengths.to(torch.float64),   # shorter is better
    "token_efficiency": _token_efficiency,                            # reward per token, higher is better
}


@dataclass(frozen=True)
class GfpoParams:
    sample_size: int = param(0, "k: completions sampled per prompt, of which the best rollout.num_generations are "
                             "kept (k > rollout.num_generations; 0 = off).")

    def __post_init__(self) -> None:
        require(self.sample_size >= 0, "sample_size must be >= 0")


GFPO_METRIC_PARAMS: dict[str, type] = {name: GfpoParams for name in GFPO_METRICS}


def gfpo_select(rewards: torch.Tensor, lengths: torch.Tensor, k: int, group_size: int,
                metric: str = "length") -> torch.Tensor:
    """GFPO (Shrivastava et al., 2025, "Sample more to think less"): of the k completions sampled for
    each prompt keep the G best by ``GFPO_METRICS[metric]``. Ties go to the lower index; the kept
    rows of a group stay in their original order.

    Shape: rewards, lengths [B * k]  ->  LongTensor [B * G] of row indices
    """
    if not 1 <= group_size <= k:
        raise ValueError(f"gfpo_select: need 1 <= G <= k, got G = {group_size}, k = {k}")
    _check_groups(rewards.numel(), k, "gfpo_select")
    r = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, k)     # [B, k]
    score = GFPO_METRICS[metric](r, lengths.view(-1, k))                              # [B, k]
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :group_size]
    kept = order.sort(dim=1).values                                                  # original order
    return (kept + torch.arange(r.shape[0], device=kept.device).unsqueeze(1) * k).reshape(-1)

# ---------------------------------------------------------------- DAPO overlong handling


def overlong_keep(truncated: torch.Tensor) -> torch.Tensor:
    """DAPO overlong filtering: 0 for truncated completions (masked out of the loss), else 1.

    Shape: [N] bool -> [N] float32
    """
    return (~truncated.bool()).float()


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment (eq. 13), added to the reward:

        R(y) = 0                               if |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
             = -1                              if |y| > L_max
    times ``factor``. ``cache`` (L_cache) = 0 switches it off (all zeros).

    Shape: lengths [N] -> [N] float32
    """
    if not 0 <= cache <= max_len:
        raise ValueError(f"soft_overlong_penalty: need 0 <= cache <= max_len, got cache = {cache}, max_len = {max_len}")
    y = lengths.to(torch.float64)
    if cache == 0:
        return torch.zeros_like(y, dtype=torch.float32)
    start = max_len - cache
    ramp = torch.where(y <= start, 0.0, (start - y) / cache)
    return (torch.where(y > max_len, -1.0, ramp) * factor).float()

# ---------------------------------------------------------------- KL in the reward


def kl_in_reward(rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """Outcome reward minus the KL penalty summed over the response (verl ``use_kl_in_reward``):

        r'_i = r_i - beta * sum_t kl_it m_it

    NaN rewards stay NaN; values at padding (m = 0) are ignored even when not finite.

    Shape: rewards [N], kl [N, T], mask [N, T] -> [N]
    """
    penalty = torch.where(mask > 0, kl, 0).sum(dim=1)                          # [N]
    return rewards - beta * penalty.to(rewards)                                # rewards' dtype and device

# ---------------------------------------------------------------- top-rho entropy tokens


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """Keep the ceil(rho * active) active tokens of highest entropy over the whole batch (Wang et
    al., 2025, "Beyond the 80/20 rule"). Ties go to the earlier token (row-major order); rho = 1
    keeps every active token.

    Shape: entropy, mask [N, T] -> [N, T] float32 (1 = kept)
    """
    if not 0 < rho <= 1:
        raise ValueError(f"top_entropy_mask: rho must be in (0, 1], got {rho}")
    active = (mask > 0).reshape(-1).nonzero().squeeze(1)                      # flat indices, ascending
    keep = math.ceil(round(rho * active.numel(), 9))                          # no 0.7 * 10 = 7.000001 -> 8
    order = torch.sort(entropy.reshape(-1)[active], descending=True, stable=True).indices[:keep]
    out = torch.zeros(mask.numel(), dtype=torch.float32, device=mask.device)
    out[active[order]] = 1.0
    return out.view(mask.shape)

# ---------------------------------------------------------------- process supervision


def token_step_ids(token_texts: list[list[str]], delimiter: str, width: int | None = None) -> torch.Tensor:
    """The reasoning step of each completion token; steps end at ``delimiter`` (e.g. "\\n").

    Steps are those of ``text.split(delimiter)`` on the concatenated token texts: the step of a token
    is the number of delimiters that end before the token starts. A token that completes a delimiter
    (or contains one, or several) belongs to the first step it closes; a delimiter split over several
    tokens closes the step at its last token. Steps count from 0.

    Shape: N lists of token strings -> LongTensor [N, width or longest], -1 at padding
    """
    if not delimiter:
        raise ValueError("token_step_ids: the delimiter must be a non-empty string")
    T = max((len(t) for t in token_texts), default=0) if width is None else width
    out = torch.full((len(token_texts), T), -1, dtype=torch.long, device="cpu")   # host-side, from texts
    for i, texts in enumerate(token_texts):
        if len(texts) > T:
            raise ValueError(f"token_step_ids: completion {i} has {len(texts)} tokens, more than width {T}")
        step, pending = 0, ""                       # pending: the text after the last delimiter
        for t, text in enumerate(texts):
            out[i, t] = step
            *closed, pending = (pending + text).split(delimiter)   # left to right, non-overlapping
            step += len(closed)
    return out


def process_advantages(step_rewards: list[list[float]], step_ids: torch.Tensor, group_size: int,
                       eps: float = 1e-4) -> torch.Tensor:
    """Process-supervised GRPO advantages (DeepSeekMath section 4.1.3).

        r~_ij = (r_ij - mean(R)) / (std(R) + eps),   R = every step reward of the G completions
        A_it  = sum_{j >= step(t)} r~_ij              (the token's own step and all later ones)

    ``step_rewards[i][j]`` is the reward of step j of completion i (NaN = none: left out of the
    statistics, contributes 0). Tokens past the last rewarded step and padding (-1) get 0. Rewards
    of steps that own no token (an empty step closed by the same token as the previous one, or a
    trailing one) still count in the statistics and in the sums of the earlier tokens. A group with
    fewer than 2 finite step rewards, or whose step rewards all tie, gets 0 everywhere. The std is
    unbiased, as for outcome rewards.

    Shape: N lists of step rewards, step_ids [N, T] (from ``token_step_ids``) -> [N, T] float32
    """
    N = step_ids.shape[0]
    if len(step_rewards) != N:
        raise ValueError(f"process_advantages: {len(step_rewards)} reward lists for {N} completions")
    if group_size < 2:
        raise ValueError("process_advantages: group_size must be >= 2 (a group of one has no relative advantage)")
    _check_groups(N, group_size, "process_advantages")
    S = max((len(rs) for rs in step_rewards), default=0)
    if S == 0:
        return torch.zeros(step_ids.shape, dtype=torch.float32, device=step_ids.device)  # no step reward
    table = torch.full((N, S), torch.nan, dtype=torch.float64, device=step_ids.device)  # [N, S], NaN = none
    for i, rs in enumerate(step_rewards):
        table[i, :len(rs)] = torch.tensor(rs, dtype=torch.float64, device=table.device)
    normed = group_normalise(table.view(-1, group_size * S), eps).view(N, S)  # stats over the whole group
    suffix = normed.flip(1).cumsum(1).flip(1)                                 # [N, S] sum over steps >= j
    suffix = torch.cat([suffix, suffix.new_zeros(N, 1)], dim=1)               # column S: "no step" -> 0
    idx = torch.where(step_ids < 0, S, step_ids.clamp(max=S))                 # padding and unrewarded -> S
    return suffix.gather(1, idx).float()
