"""Entropy-shaped advantages: EDGE-GRPO, GTPO and GRPO-S. Pure functions, rows ordered group by group.

``entropy`` [N, T] is the policy's token entropy H_it = -sum_v pi(v | q, o_<t) log pi(v | q, o_<t) at
sampling time (no gradient), ``mask`` [N, T] the completion tokens. Every entry of ``ENTROPY_ADVANTAGES``
(``algorithm.entropy_advantage``) maps (rewards [N], advantages [N], correct [N] bool, entropy, mask,
G, weight, estimator, eps) to advantages [N] or [N, T]; ``estimator`` is the configured advantage estimator
(``fn(rewards [N]) -> [N]``), used by the variants that reshape rewards before it.

* ``edge``    EDGE-GRPO's entropy-driven advantage (Zhang et al., arXiv 2507.21848).
* ``gtpo``    GTPO, entropy-weighted token rewards (Tan et al., arXiv 2508.04349).
* ``grpo_s``  GRPO-S, entropy-weighted sequence rewards (the same paper).

``guided_correction_rows`` picks where EDGE-GRPO's guided error correction puts a reference solution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from grpo.algorithms.advantages import group_stats
from grpo.algorithms.params import NoParams, param, require

TINY = 1e-8   # floor of an entropy we divide by (a deterministic token has H = 0)


def mean_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """H_i = mean of H_it over the completion's tokens (0 without tokens).  [N, T] x2 -> [N] float64."""
    m = mask.to(torch.float64)
    return (entropy.to(torch.float64) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)


def edge_advantages(rewards, advantages, correct, entropy, mask, group_size, weight, estimator,
                    eps: float = 1e-4) -> torch.Tensor:
    """EDGE-GRPO entropy-driven advantage (EDA; the authors' grpo_aha_trainer.py, ``EDA``):

        A^_i = A_i / (H_i / mean_j H_j) = A_i * mean_j H_j / H_i

    H_i the mean token entropy of completion i, the mean over every completion of the step with tokens.
    Confident (low-entropy) correct answers gain, confident wrong ones are pushed down harder; uncertain
    completions move less. Equal entropies give A^ = A (the reduction to GRPO).

    Shape: advantages [N] -> [N] (advantages' dtype)
    """
    h = mean_entropy(entropy, mask)                                             # [N]
    live = mask.sum(dim=1) > 0
    batch_mean = h[live].mean() if bool(live.any()) else h.new_ones(())
    scale = batch_mean / h.clamp(min=TINY)
    return torch.where(live, advantages.to(torch.float64) * scale, 0).to(advantages.dtype)


def _signed_shares(value: torch.Tensor, members: torch.Tensor, group_size: int) -> torch.Tensor:
    """value / sum of value over the group's members, times their count: 1 on average over the members.
    Along dim 1 of [B, G, ...] tensors; 0 off the members."""
    v = torch.where(members, value, 0)
    total = v.sum(dim=1, keepdim=True)
    count = members.sum(dim=1, keepdim=True)
    return torch.where(members & (total > 0), v / total.clamp(min=TINY) * count, torch.where(members, 1.0, 0.0))


def grpo_s_rewards(rewards: torch.Tensor, correct: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                   group_size: int, weight: float) -> torch.Tensor:
    """GRPO-S shaped sequence rewards, with beta_2 = ``weight`` and beta_1 = 1:

        r^_i = r_i + beta_2 * n * H_i / sum_{k in O+} H_k              for correct i (O+, n = |O+|)
        r^_j = r_j - beta_2 * m * (1/H_j) / sum_{k in O-} (1/H_k)       for wrong j (O-, m = |O-|)

    H_i the completion's mean token entropy. Within each set the entropy term averages to beta_2, so
    correct completions keep their lead; among them the more exploratory (higher-entropy) ones gain, among
    the wrong ones the confident (low-entropy) ones lose most. NaN rewards stay NaN.

    Shape: rewards [N], correct [N] bool, entropy / mask [N, T] -> [N] float64
    """
    h = mean_entropy(entropy, mask).view(-1, group_size)                        # [B, G]
    c = correct.view(-1, group_size)
    r = rewards.to(torch.float64).view(-1, group_size)
    w = ~c & torch.isfinite(r)
    bonus = _signed_shares(h, c, group_size) - _signed_shares(1 / h.clamp(min=TINY), w, group_size)
    return (r + weight * bonus).reshape(-1)


def outcome_ties(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Rows of groups whose own rewards carry no signal (all equal, or fewer than two finite), where
    GRPO's advantage is 0.  [N] -> [N] bool.

    The entropy terms of GTPO and GRPO-S only move credit within a group that has a signal. Left alone
    in such a group, they are all that differs between its completions, and normalising by the group's
    std blows those differences up to unit advantages whatever the weight: every step then pushes the
    confident (low-entropy) tokens of solved prompts down. On the demo task that took GTPO's training
    accuracy from 0.65 to 0.08 over 300 steps at the paper's weight (docs/variants.md). The paper trains
    on DAPO, whose dynamic sampling drops these groups before the shaping.
    """
    return group_stats(rewards.to(torch.float64).view(-1, group_size)).degenerate.expand(-1, group_size).reshape(-1)


def grpo_s_advantages(rewards, advantages, correct, entropy, mask, group_size, weight, estimator,
                      eps: float = 1e-4) -> torch.Tensor:
    """GRPO-S: the configured estimator applied to :func:`grpo_s_rewards`; 0 for the rows of groups
    whose rewards tie (:func:`outcome_ties`).  [N] -> [N]."""
    adv = estimator(grpo_s_rewards(rewards, correct, entropy, mask, group_size, weight).to(rewards.dtype))
    return torch.where(outcome_ties(rewards, group_size), 0, adv)


def gtpo_token_rewards(rewards: torch.Tensor, correct: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                       group_size: int, weight: float) -> torch.Tensor:
    """GTPO shaped token rewards (paper eq. 3 and 5), with alpha_2 = ``weight`` and alpha_1 = 1 (the
    paper's experiments: alpha_1 = 1, alpha_2 = 0.1; its rewards are +1 / -1, here r is the step's reward):

        r~_it = r_i + alpha_2 * d_t * H_it / sum_{k in O+, t < |o_k|} H_kt            (i correct)
        r~_jt = r_j - alpha_2 * h_t * (1/H_jt) / sum_{k in O-, t < |o_k|} (1/H_kt)    (j wrong)

    d_t (h_t): how many correct (wrong) completions of the group have a token at position t. At each
    position the entropy term averages to alpha_2 over the set, so it redistributes credit between the
    tokens of one set without moving the set's total.

    Shape: rewards [N], correct [N] bool, entropy / mask [N, T] -> [N, T] float64 (0 off the mask)
    """
    N, T = entropy.shape
    H = entropy.to(torch.float64).view(-1, group_size, T)                       # [B, G, T]
    on = mask.view(-1, group_size, T) > 0
    r = rewards.to(torch.float64).view(-1, group_size, 1)
    c = correct.view(-1, group_size, 1) & on
    w = ~correct.view(-1, group_size, 1) & torch.isfinite(r) & on
    bonus = _signed_shares(H, c, group_size) - _signed_shares(1 / H.clamp(min=TINY), w, group_size)
    shaped = r + weight * bonus                                                # [B, G, T]
    return torch.where(on, shaped, 0).view(N, T)


def gtpo_advantages(rewards, advantages, correct, entropy, mask, group_size, weight, estimator,
                    eps: float = 1e-4) -> torch.Tensor:
    """GTPO token advantages: each shaped token reward normalised by its group's statistics,

        A~_it = (r~_it - mean(R)) / (std(R) + eps),   R = {mean_t r~_it : i in the group}

    mean and unbiased std over the completions' mean shaped rewards. A group whose own rewards tie, or
    that has fewer than two, gets 0, as in grpo.algorithms.advantages (:func:`outcome_ties`: the
    entropy term alone is no signal). With weight = 0 every token of
    completion i gets exactly GRPO's A_i (the reduction test); the configured estimator is not used.

    Shape: -> [N, T] float64 (0 off the mask)
    """
    tok = gtpo_token_rewards(rewards, correct, entropy, mask, group_size, weight)          # [N, T]
    R = torch.where(torch.isfinite(rewards.to(torch.float64)), mean_entropy(tok, mask), torch.nan)  # [N]
    s = group_stats(R.view(-1, group_size))                                               # [B, ...]
    ok = (s.finite & ~s.degenerate).reshape(-1, 1) & ~outcome_ties(rewards, group_size)[:, None]   # [N, 1]
    mean, std = s.mean.repeat_interleave(group_size, 0), s.std.repeat_interleave(group_size, 0)   # [N, 1]
    adv = (tok - mean) / (std + eps)                                                      # [N, T]
    return torch.where(ok & (mask > 0), adv, 0.0)


EntropyAdvantageFn = Callable[..., torch.Tensor]

ENTROPY_ADVANTAGES: dict[str, EntropyAdvantageFn | None] = {
    "none": None,                 # no entropy pass, advantages unchanged
    "edge": edge_advantages,
    "gtpo": gtpo_advantages,
    "grpo_s": grpo_s_advantages,
}


@dataclass(frozen=True)
class EntropyRewardParams:
    reward_weight: float = param(0.1, "The weight alpha_2 (beta_2) of the entropy term in the shaped reward, the "
                                 "outcome's weight being 1 (GTPO's experiments: 0.1).")

    def __post_init__(self) -> None:
        require(0 <= self.reward_weight <= 1, "reward_weight must be in [0, 1]")


ENTROPY_ADVANTAGE_PARAMS: dict[str, type] = {"none": NoParams, "edge": NoParams, "gtpo": EntropyRewardParams,
                                             "grpo_s": EntropyRewardParams}


def guided_correction_rows(correct: torch.Tensor, rewarded: torch.Tensor, has_solution: torch.Tensor,
                           group_size: int) -> torch.Tensor:
    """EDGE-GRPO guided error correction (GEC): the rows to replace by the reference solution, one per
    group that has rewards, no correct completion and a solution: its last completion (g = G - 1).

    Shape: correct, rewarded [N] bool, has_solution [B] bool -> LongTensor [M] of row indices
    """
    c = correct.view(-1, group_size)
    any_reward = rewarded.view(-1, group_size).any(dim=1)
    hit = ~c.any(dim=1) & any_reward & has_solution.to(torch.bool)              # [B]
    return hit.nonzero().squeeze(1) * group_size + (group_size - 1)
