"""GRPO-LEAD (arXiv 2504.09696): hand-derived values and float64 reimplementations."""

import math

import pytest
import torch

from grpo.algorithms.advantages import grpo_advantages
from grpo.algorithms.lead import (DIFFICULTY_WEIGHTINGS, correct_length_z, group_accuracy, lead_correctness_reward,
                                  lead_difficulty_weights, logistic_weight)

CPU = torch.device("cpu")
f64 = lambda *v: torch.tensor(v, dtype=torch.float64, device=CPU)  # noqa: E731


def test_length_z_hand_values():
    # one group of 4: correct lengths 10, 20, 30 (mean 20, unbiased std 10), the wrong one (length 99) gets 0
    correct = torch.tensor([True, True, False, True], device=CPU)
    z = correct_length_z(correct, f64(10, 20, 99, 30), 4)
    assert torch.allclose(z, f64(-1, 0, 0, 1) * 10 / (10 + 1e-6), rtol=1e-12)


def test_length_z_with_one_correct_is_zero_and_groups_are_separate():
    correct = torch.tensor([False, True, False, True, True, False], device=CPU)
    z = correct_length_z(correct, f64(5, 7, 9, 4, 8, 100), 3)
    # group 1: a single correct one -> sigma = 1, z = 0; group 2: lengths 4, 8 -> mean 6, std sqrt(8)
    s = math.sqrt(8)
    assert torch.allclose(z, f64(0, 0, 0, -2 / (s + 1e-6), 2 / (s + 1e-6), 0), rtol=1e-12)


def test_lead_correctness_reward_hand_values():
    values = f64(1, 1, 0, 1, math.nan)           # a group of 5; the last has no reward
    lengths = f64(10, 20, 15, 30, 12)
    out = lead_correctness_reward(values, lengths, 5, alpha=0.05, wrong_penalty=1.0)
    z = 10 / (10 + 1e-6)
    expected = f64(math.exp(0.05 * z), 1.0, -1.0, math.exp(-0.05 * z), math.nan)
    assert torch.allclose(out, expected, rtol=1e-12, equal_nan=True)
    # shorter correct answers earn more, every correct one more than any wrong one
    assert out[0] > out[1] > out[3] > 0 > out[2]


def test_lead_reward_reduces_to_the_plain_reward():
    values = f64(1, 0, 1, 0.5, 0, math.nan)
    out = lead_correctness_reward(values, f64(3, 8, 9, 1, 4, 2), 3, alpha=0.0, wrong_penalty=0.0)
    assert torch.equal(torch.isnan(out), torch.isnan(values))
    assert torch.equal(out[:5], values[:5])


def test_logistic_weight_hand_values():
    x = f64(0.0, 0.75, 1.0)
    w = logistic_weight(x, 0.4, 1.5, 0.75, 10.0)
    expected = f64(0.4 + 1.1 / (1 + math.exp(-7.5)), 0.4 + 1.1 / 2, 0.4 + 1.1 / (1 + math.exp(2.5)))
    assert torch.allclose(w, expected, rtol=1e-12)
    assert w[0] > w[1] > w[2]                    # the harder the prompt (lower accuracy), the larger the weight


def reference_difficulty(adv, correct, G, A=0.4, B=1.5, x0=0.75, k=10.0):
    """The authors' loop (core_algos.py), in float64 Python."""
    out = []
    for i, a in enumerate(adv):
        group = correct[(i // G) * G:(i // G + 1) * G]
        rho = sum(group) / G
        x = rho if a > 0 else 1 - rho
        out.append(a * (A + (B - A) / (1 + math.exp(k * (x - x0)))))
    return out


def test_difficulty_weights_match_the_authors_loop():
    rewards = f64(1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1)               # 3 groups of 4: accuracy 1/4, 3/4, 1/2
    correct = rewards > 0
    adv = grpo_advantages(rewards, 4).values
    got = lead_difficulty_weights(adv, correct, torch.ones_like(correct), 4)
    assert torch.allclose(got, f64(*reference_difficulty(adv.tolist(), correct.tolist(), 4)), rtol=1e-12)
    # hard prompt (rho = 1/4): the correct answer's weight w(0.25) = 0.4 + 1.1 / (1 + e^-5) ~ 1.4926
    assert float(got[0] / adv[0]) == pytest.approx(0.4 + 1.1 / (1 + math.exp(-5)), rel=1e-12)


def test_difficulty_weights_per_token_and_registry():
    rewards = f64(1, 0, 0, 1)
    correct = rewards > 0
    adv = grpo_advantages(rewards, 4).values
    per_token = adv.unsqueeze(1).expand(4, 3).clone()
    per_token[0, 2] = -0.3                                             # a token of opposite sign: w(1 - rho)
    got = lead_difficulty_weights(per_token, correct, torch.ones_like(correct), 4)
    row = lead_difficulty_weights(adv, correct, torch.ones_like(correct), 4)
    assert torch.allclose(got[:, 0], row)
    assert float(got[0, 2]) == pytest.approx(-0.3 * float(logistic_weight(f64(0.5), 0.4, 1.5, 0.75, 10.0)))
    assert DIFFICULTY_WEIGHTINGS["none"](adv, correct, correct, 4) is adv


def test_group_accuracy_ignores_rows_without_reward():
    correct = torch.tensor([True, False, False, True, True, True], device=CPU)
    rewarded = torch.tensor([True, True, False, True, True, True], device=CPU)
    assert torch.allclose(group_accuracy(correct, rewarded, 3), f64(0.5, 1.0))


def test_uniform_weights_reduce_to_grpo():
    """w_min = w_max = 1: the weights are 1 everywhere, GRPO's advantages unchanged."""
    rewards = f64(1, 0, 0, 0, 1, 1)
    adv = grpo_advantages(rewards, 3).values
    got = lead_difficulty_weights(adv, rewards > 0, torch.ones(6, dtype=torch.bool), 3, w_min=1.0, w_max=1.0)
    assert torch.equal(got, adv)
