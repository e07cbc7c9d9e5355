"""Hybrid GRPO: GRPO's multi-sample baseline together with a learned value estimate (Sane, 2025, "Hybrid
Group Relative Policy Optimization: A Multi-Sample Approach to Enhancing Policy Optimization",
arXiv 2502.01652). The paper's advantage, for a state s_t with N sampled actions,

    A_t = 1/N sum_n [ f(r(s_t, a_t^n)) + gamma V(s_{t+1}^n) ] - V(s_t)

keeps PPO's bootstrapped value V next to GRPO's empirical mean over samples. For a completion (one
terminal step: V(s_{t+1}) = 0, f = the identity) the empirical part is the group's mean reward and V(s_t)
is the value of the prompt, V(q). This library gives each completion its own advantage against a
baseline that mixes the two:

    b_q = alpha * mean_g(r) + (1 - alpha) * V(q)
    A_i = (r_i - b_q) / d_q,     d_q = REWARD_SCALES[scale_rewards] (group std + eps, ...) where the
                                  group's rewards differ, 1 where they tie

alpha = 1 is GRPO's estimator exactly (tested); alpha = 0 is a critic baseline (PPO with one step).
A group whose rewards tie still learns when V(q) differs from its reward (a critic's point). V is
trained by the value loss 1/2 mean_i (V(q_i) - r_i)^2 over the completions with a reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.algorithms.advantages import REWARD_SCALES, Advantages, group_stats
from grpo.algorithms.params import NoParams, param, require


def hybrid_advantages(rewards: torch.Tensor, values: torch.Tensor, group_size: int, alpha: float,
                      eps: float = 1e-4, scale_rewards: str = "group") -> Advantages:
    """Advantages against the mixed baseline (module docstring); NaN rewards get 0.

    Shape: rewards [N] with N = B * G, values [B] (V of each prompt) -> Advantages with values [N]
    """
    if rewards.dim() != 1 or rewards.numel() != values.numel() * group_size:
        raise ValueError(f"hybrid_advantages: {rewards.numel()} rewards for {values.numel()} prompts x {group_size}")
    r = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)       # [B, G]
    s = group_stats(r)
    v = values.to(r).view(-1, 1)                                                                 # [B, 1]
    baseline = alpha * s.mean + (1.0 - alpha) * v                                                # [B, 1]
    divisor = torch.where(s.degenerate, torch.ones_like(s.std), REWARD_SCALES[scale_rewards](r, s, eps))
    adv = torch.where(s.finite, (r - baseline) / divisor, 0)                                     # [B, G]
    if alpha == 1.0:
        adv = torch.where(s.degenerate, 0, adv)                    # GRPO: a tied group carries no signal
    return Advantages(adv.reshape(-1), int(s.degenerate.sum()), s.degenerate.shape[0])


def value_loss(values: torch.Tensor, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """1/2 mean over rewarded completions of (V(q_i) - r_i)^2 (0 without any).

    Shape: values [B], rewards [N = B * G] -> []
    """
    v = values.repeat_interleave(group_size)                                                     # [N]
    r = rewards.to(v)
    finite = torch.isfinite(r)
    diff = torch.where(finite, v - torch.where(finite, r, 0), 0)
    return 0.5 * (diff ** 2).sum() / finite.sum().clamp(min=1)


class ValueHead(torch.nn.Module):
    """V(q) = w . h + b on a feature vector h of the prompt; starts at V = 0."""

    def __init__(self, hidden_size: int, device: torch.device):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1, device=device, dtype=torch.float32)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[B, H] -> [B]"""
        return self.linear(features.float()).squeeze(-1)


@dataclass(frozen=True)
class ValueHeadParams:
    alpha: float = param(0.5, "Weight of the group's mean reward in the baseline (1 = GRPO, 0 = the critic alone).")
    lr: float = param(1e-3, "AdamW learning rate of the value head (its own optimizer).")
    steps: int = param(1, "Value-head optimizer steps on each step's prompts and rewards.")

    def __post_init__(self) -> None:
        require(0 <= self.alpha <= 1, "alpha must be in [0, 1]")
        require(self.lr > 0 and self.steps >= 1, "lr must be > 0 and steps >= 1")


#: algorithm.critic: none | value_head (grpo/training/critic.py builds it).
CRITIC_PARAMS: dict[str, type] = {"none": NoParams, "value_head": ValueHeadParams}
