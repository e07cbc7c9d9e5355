"""lambda-GRPO's learnable token preference (grpo/algorithms/token_preference.py), float64."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.algorithms.loss import AGGREGATIONS, grpo_loss
from grpo.algorithms.token_preference import (TokenPreference, group_length_scores, preference_weights,
                                              weighted_token_mean)

CPU = torch.device("cpu")
F64 = torch.float64


def batch(lengths, T=5, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = len(lengths)
    mask = (torch.arange(T, device=CPU)[None, :] < torch.tensor(lengths, device=CPU)[:, None]).to(F64)
    logp = -torch.rand(n, T, generator=g, dtype=F64)
    old = logp + (torch.rand(n, T, generator=g, dtype=F64) - 0.5) * 0.6
    adv = torch.randn(n, generator=g, dtype=F64)
    return logp, old, adv, mask


def loss_with(f, logp, old, adv, mask, mode="token-mean"):
    normalizer = AGGREGATIONS[mode].normalizer(mask, 5)
    return grpo_loss(logp, old, None, adv, mask, epsilon=0.2, epsilon_high=0.28, beta=0.0, agg_mode=mode,
                     normalizer=normalizer, policy_weight=None if f is None else f.unsqueeze(1)).loss


def test_hand_derived_weights():
    """G = 2, lengths 1 and 3: mean 2, unbiased std sqrt(2), z = -/+ 1/sqrt(2); r = 0.5: h = 1 -/+ 0.5/sqrt(2).
    lambda = 1: f = 2 e^{h_i} / (e^{h_1} + e^{h_2}); lambda = 2: the same with h^2."""
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=F64, device=CPU)
    h, pos = group_length_scores(mask, 2, 0.5, eps=0.0)
    h1, h2 = 1 - 0.5 / math.sqrt(2), 1 + 0.5 / math.sqrt(2)
    torch.testing.assert_close(h.double(), torch.tensor([[h1, h2], [h1, h2]], dtype=F64), rtol=1e-6, atol=1e-6)
    assert pos.tolist() == [0, 1]
    for lam in (1.0, 2.0):
        a, b = math.exp(h1 ** lam), math.exp(h2 ** lam)
        f = preference_weights(h.double(), pos, torch.tensor(lam, dtype=F64))
        torch.testing.assert_close(f, torch.tensor([2 * a / (a + b), 2 * b / (a + b)], dtype=F64), rtol=1e-6, atol=1e-6)


def test_lambda_zero_is_dapo_token_mean_loss_and_gradient():
    logp0, old, adv, mask = batch([5, 1, 3, 2, 4, 4])
    h, pos = group_length_scores(mask, 3, 0.5)
    f = preference_weights(h.double(), pos, torch.tensor(0.0, dtype=F64))
    assert torch.equal(f, torch.ones(6, dtype=F64))
    a, b = logp0.clone().requires_grad_(True), logp0.clone().requires_grad_(True)
    mine, dapo = loss_with(f, a, old, adv, mask), loss_with(None, b, old, adv, mask)
    assert float(mine.detach()) == pytest.approx(float(dapo.detach()), abs=1e-15)
    mine.backward()
    dapo.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-15)


def test_tied_lengths_reduce_to_grpo_for_any_lambda():
    """Every completion of length 4: f = 1 whatever lambda, and the token mean is GRPO's per-completion mean."""
    logp0, old, adv, mask = batch([4] * 6)
    h, pos = group_length_scores(mask, 3, 0.5)
    f = preference_weights(h.double(), pos, torch.tensor(0.7, dtype=F64))
    torch.testing.assert_close(f, torch.ones(6, dtype=F64))
    a, b = logp0.clone().requires_grad_(True), logp0.clone().requires_grad_(True)
    mine, grpo = loss_with(f, a, old, adv, mask), loss_with(None, b, old, adv, mask, "seq-mean-token-mean")
    assert float(mine.detach()) == pytest.approx(float(grpo.detach()), abs=1e-14)
    mine.backward()
    grpo.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-14)


def test_the_unified_form_holds_grpo_and_dapo():
    """sum_i f_i sum_t l_it / sum|o|: f = 1 is DAPO; f_i = sum|o| / (N |o_i|) is GRPO's seq-mean-token-mean."""
    _, _, _, mask = batch([5, 1, 3, 2])
    values = torch.randn(4, 5, dtype=F64, generator=torch.Generator(device="cpu").manual_seed(1))
    total = float(mask.sum())
    dapo = (values * mask).sum() / total
    grpo = ((values * mask).sum(1) / mask.sum(1)).mean()
    assert float(weighted_token_mean(values, mask, torch.ones(4, dtype=F64), total)) == pytest.approx(float(dapo))
    f_grpo = total / (4 * mask.sum(1))
    assert float(weighted_token_mean(values, mask, f_grpo, total)) == pytest.approx(float(grpo), abs=1e-14)


def test_lambda_gradient_matches_finite_differences_and_favours_the_better_lengths():
    """dL/dlambda by autograd equals the central difference of the float64 loss. With the long completions
    advantaged, lowering the loss needs lambda > 0 (weight towards longer): the gradient is negative."""
    logp, old, _, mask = batch([5, 1, 4, 2])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=F64)                 # longer ones better in both groups
    h, pos = group_length_scores(mask, 2, 0.5)

    def loss_at(lam):
        return loss_with(preference_weights(h.double(), pos, lam), logp, logp, adv, mask)

    lam = torch.tensor(0.3, dtype=F64, requires_grad=True)
    loss_at(lam).backward()
    e = 1e-6
    numeric = (float(loss_at(torch.tensor(0.3 + e, dtype=F64))) - float(loss_at(torch.tensor(0.3 - e, dtype=F64)))) / (2 * e)
    assert float(lam.grad) == pytest.approx(numeric, rel=1e-6)
    assert float(lam.grad) < 0


def test_module_weights_and_metrics():
    module = TokenPreference(0.0, 0.5, 2, CPU)
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.float32, device=CPU)
    h, pos = module.step_inputs(mask)
    w = module.weights(h, pos)
    assert w.shape == (2, 1) and torch.allclose(w, torch.ones(2, 1))
    w.sum().backward()
    assert module.lam.grad is not None
    assert module.metrics() == {"lambda_grpo/lambda": 0.0}
