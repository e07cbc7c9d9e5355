"""GRPO-LEAD (Zhang & Zuo, 2025, arXiv 2504.09696): length-dependent accuracy, an explicit penalty for
wrong answers and difficulty-aware advantage weights. Pure functions; rows are ordered group by group
(row i * G + g is completion g of prompt i) as in ``grpo.algorithms.advantages``.

``correct`` is a [N] bool tensor: the correctness reward (``algorithm.correctness_reward``) > 0. A row
whose correctness reward is missing (NaN) is neither correct nor counted in a group's accuracy.

Constants as in the authors' code (github.com/aeroplanepaper/GRPO-LEAD, verl/verl/trainer/main_ppo.py and
ppo/core_algos.py): alpha = 0.05, eps = 1e-6, the unbiased std of the correct lengths (1 with fewer than
two correct), logistic A = 0.4, B = 1.5, rho_0 = 0.75, k = 10.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from grpo.algorithms.params import NoParams, param, require


def _check(n: int, group_size: int, name: str) -> None:
    if group_size < 1 or n % group_size != 0:
        raise ValueError(f"{name}: {n} rows do not split into groups of {group_size}")


def correct_length_z(correct: torch.Tensor, lengths: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """z_i = (|o_i| - mu) / (sigma + eps) over the correct completions of each group (0 for the others).

    mu, sigma: mean and unbiased std of the lengths of the group's correct completions; sigma = 1 when the
    group has fewer than two of them (then z = 0 for its single correct completion).

    Shape: correct [N] bool, lengths [N] -> [N] float64
    """
    _check(correct.numel(), group_size, "correct_length_z")
    c = correct.view(-1, group_size)                                            # [B, G]
    L = lengths.to(torch.float64).view(-1, group_size)                          # [B, G]
    n = c.sum(dim=1, keepdim=True)                                              # [B, 1]
    mu = torch.where(c, L, 0).sum(dim=1, keepdim=True) / n.clamp(min=1)
    var = torch.where(c, (L - mu) ** 2, 0).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
    sigma = torch.where(n > 1, var.sqrt(), 1.0)                                 # authors' code: 1 below two
    return torch.where(c, (L - mu) / (sigma + eps), 0).reshape(-1)


def lead_correctness_reward(values: torch.Tensor, lengths: torch.Tensor, group_size: int, alpha: float,
                            wrong_penalty: float) -> torch.Tensor:
    """GRPO-LEAD's correctness reward (section 3.1 and 3.2 of the paper):

        R(o_i) = r_i * exp(-alpha * z_i)    if o_i is correct (r_i > 0; r_i = 1 for a binary accuracy)
               = -wrong_penalty             if o_i is wrong and wrong_penalty > 0 (GRPO-LEAD: -1)
               = r_i                        otherwise (wrong with no penalty, or NaN = no reward)

    z_i from :func:`correct_length_z`: the shortest correct completions of a group earn the most, the
    longest the least, always more than 0, so correctness still dominates. alpha = 0 and wrong_penalty = 0
    return ``values`` unchanged.

    Shape: values, lengths [N] -> [N] (values' dtype)
    """
    correct = values > 0                                                        # NaN > 0 is False
    z = correct_length_z(correct, lengths, group_size)                          # [N] float64
    out = values.to(torch.float64)
    out = torch.where(correct, out * torch.exp(-alpha * z), out)
    if wrong_penalty > 0:
        out = torch.where(~correct & torch.isfinite(out), -float(wrong_penalty), out)
    return out.to(values.dtype)


def logistic_weight(x: torch.Tensor, w_min: float, w_max: float, midpoint: float, steepness: float) -> torch.Tensor:
    """w(x) = w_min + (w_max - w_min) / (1 + exp(k (x - x_0))): decreasing in x, w_max for x << x_0."""
    return w_min + (w_max - w_min) / (1 + torch.exp(steepness * (x - midpoint)))


def group_accuracy(correct: torch.Tensor, rewarded: torch.Tensor, group_size: int) -> torch.Tensor:
    """rho_q: share of correct completions among the group's rewarded ones.  [N] bool x2 -> [B] float64."""
    c = correct.view(-1, group_size).to(torch.float64)
    n = rewarded.view(-1, group_size).sum(dim=1).clamp(min=1)
    return c.sum(dim=1) / n


def lead_difficulty_weights(advantages: torch.Tensor, correct: torch.Tensor, rewarded: torch.Tensor,
                            group_size: int, w_min: float = 0.4, w_max: float = 1.5, midpoint: float = 0.75,
                            steepness: float = 10.0) -> torch.Tensor:
    """GRPO-LEAD difficulty-aware advantage reweighting (paper section 3.3, the authors' core_algos.py):

        A'_i = A_i * w(rho_q)        if A_i > 0    (a correct answer to a hard prompt weighs more)
             = A_i * w(1 - rho_q)    if A_i <= 0   (a wrong answer to an easy prompt weighs more)

    rho_q: the group's accuracy (:func:`group_accuracy`), w: :func:`logistic_weight`. Per-token
    advantages ([N, T]) are weighted row by row with the sign of each token's advantage.

    Shape: advantages [N] or [N, T], correct / rewarded [N] bool -> advantages' shape and dtype
    """
    _check(correct.numel(), group_size, "lead_difficulty_weights")
    rho = group_accuracy(correct, rewarded, group_size).repeat_interleave(group_size)      # [N]
    w_pos = logistic_weight(rho, w_min, w_max, midpoint, steepness)                         # [N]
    w_neg = logistic_weight(1 - rho, w_min, w_max, midpoint, steepness)                     # [N]
    if advantages.dim() == 2:
        w_pos, w_neg = w_pos.unsqueeze(1), w_neg.unsqueeze(1)
    weighted = torch.where(advantages > 0, advantages * w_pos.to(advantages), advantages * w_neg.to(advantages))
    return weighted


DifficultyFn = Callable[..., torch.Tensor]   # (advantages, correct, rewarded, G, **logistic) -> advantages

DIFFICULTY_WEIGHTINGS: dict[str, DifficultyFn] = {
    "none": lambda advantages, correct, rewarded, group_size, **_: advantages,
    "lead": lead_difficulty_weights,
}


@dataclass(frozen=True)
class LogisticWeightParams:
    """The keyword arguments of lead_difficulty_weights: w(rho) = w_min + (w_max - w_min) / (1 + exp(k (rho - rho_0)))."""

    w_min: float = param(0.4, "Lowest weight (of the easiest prompts).")
    w_max: float = param(1.5, "Highest weight (of the hardest prompts).")
    midpoint: float = param(0.75, "The midpoint rho_0.")
    steepness: float = param(10.0, "The steepness k.")

    def __post_init__(self) -> None:
        require(0 <= self.w_min <= self.w_max, "w_min must be >= 0 and <= w_max")


DIFFICULTY_WEIGHTING_PARAMS: dict[str, type] = {"none": NoParams, "lead": LogisticWeightParams}
