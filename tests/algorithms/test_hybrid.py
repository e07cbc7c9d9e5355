"""Hybrid GRPO's advantage and value loss (grpo/algorithms/hybrid.py), float64 and by hand."""

import math

import pytest
import torch

from grpo.algorithms.advantages import grpo_advantages
from grpo.algorithms.hybrid import ValueHead, hybrid_advantages, value_loss

CPU = torch.device("cpu")
F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64, device=CPU)


def test_hand_derived_mixed_baseline():
    """G = 2. Group 0: r = [1, 0], V = 0.8, alpha = 0.5: b = 0.5 * 0.5 + 0.5 * 0.8 = 0.65, std = 1/sqrt(2)
    (eps = 0): A = [0.35, -0.65] * sqrt(2). Group 1 ties at r = [1, 1], V = 0.2: b = 0.6, divisor 1: A = [0.4, 0.4]."""
    adv = hybrid_advantages(t([1.0, 0.0, 1.0, 1.0]), t([0.8, 0.2]), 2, 0.5, eps=0.0)
    s2 = math.sqrt(2.0)
    torch.testing.assert_close(adv.values, t([0.35 * s2, -0.65 * s2, 0.4, 0.4]))
    assert (adv.zero_std_groups, adv.num_groups) == (1, 2)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_alpha_one_is_grpo(scale):
    g = torch.Generator(device="cpu").manual_seed(0)
    r = torch.randn(12, generator=g, dtype=F64)
    r[4:8] = 0.5                                   # a tied group
    r[9] = float("nan")                            # a completion without reward
    got = hybrid_advantages(r, torch.randn(3, generator=g, dtype=F64), 4, 1.0, 1e-4, scale)
    want = grpo_advantages(r, 4, 1e-4, scale)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-15)
    assert got.zero_std_groups == want.zero_std_groups


def test_alpha_zero_is_the_critic_baseline():
    """b = V: A = (r - V) / (std + eps) with std = the group's (unbiased) std."""
    r, v = t([1.0, 0.0, 0.0]), t([0.25])
    std = float(r.std())
    torch.testing.assert_close(hybrid_advantages(r, v, 3, 0.0, eps=0.0).values, (r - 0.25) / std)


def test_value_loss_and_head():
    """V = 0.5 for a group with rewards [1, 0, None]: 1/2 ((0.5 - 1)^2 + 0.5^2) / 2 = 0.125."""
    assert float(value_loss(t([0.5]), t([1.0, 0.0, float("nan")]), 3)) == pytest.approx(0.125)
    head = ValueHead(4, CPU)
    assert torch.equal(head(torch.ones(2, 4, device=CPU)), torch.zeros(2, device=CPU))
    v = head(torch.ones(3, 4, device=CPU))
    value_loss(v, torch.ones(6, device=CPU), 2).backward()
    torch.testing.assert_close(head.linear.bias.grad, torch.tensor([-1.0]))   # d/db 1/2 mean (b - 1)^2 = -1
