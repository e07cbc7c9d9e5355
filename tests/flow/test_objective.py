"""The per-(sample, step) loss and the clipped group advantage (grpo/flow/objective.py) against a direct
float64 implementation and hand-derived numbers."""

import pytest
import torch

from grpo.flow.objective import flow_advantages, flow_loss, pair_normalizer


def test_group_advantage_is_clipped_to_adv_clip():
    # group of 4: [0, 0, 0, 1]: mean 0.25, unbiased std 0.5 -> A = [-0.5, -0.5, -0.5, 1.5]
    r = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = flow_advantages(r, 4, "group", eps=0.0, adv_clip=5.0)
    assert adv.values.tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.5, 0, 0, 0, 0])
    assert adv.zero_std_groups == 1 and adv.clipped == 0
    clipped = flow_advantages(r, 4, "group", eps=0.0, adv_clip=1.0)
    assert clipped.values.tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.0, 0, 0, 0, 0]) and clipped.clipped == 1


def test_global_std_divides_by_the_std_of_the_whole_batch():
    r = torch.tensor([0.0, 2.0, 10.0, 14.0])
    adv = flow_advantages(r, 2, "global", eps=0.0, adv_clip=100.0)
    std = float(r.std())                                  # unbiased std of all four rewards
    assert adv.values.tolist() == pytest.approx([-1 / std, 1 / std, -2 / std, 2 / std])
    with pytest.raises(ValueError, match="flow.std"):
        flow_advantages(r, 2, "batch")


def test_loss_matches_a_direct_float64_implementation_with_kl():
    g = torch.Generator().manual_seed(0)
    m, eps, beta = 12, 1e-4, 0.3
    old = torch.randn(m, generator=g, dtype=torch.float64)
    logp = (old + 2e-4 * torch.randn(m, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(m, generator=g, dtype=torch.float64)
    kl = torch.rand(m, generator=g, dtype=torch.float64)
    terms = flow_loss(logp, old, adv, eps, pair_normalizer(m, torch.device("cpu")), kl, beta)
    ratio = torch.exp(logp.detach() - old)
    direct = torch.maximum(-ratio * adv, -ratio.clamp(1 - eps, 1 + eps) * adv).mean() + beta * kl.mean()
    assert float(terms.loss.detach()) == pytest.approx(float(direct), rel=1e-12)
    assert terms.clipped == float(((ratio - 1).abs() > eps).logical_and(
        (-ratio.clamp(1 - eps, 1 + eps) * adv) > (-ratio * adv)).sum())
    assert terms.kl_sum == pytest.approx(float(kl.sum()))
    terms.loss.backward()
    inside = (ratio - 1).abs() <= eps                     # unclipped pairs: d/dlogp = -rho A / m
    assert torch.allclose(logp.grad[inside], (-ratio * adv / m)[inside])


def test_micro_batch_shares_add_up_to_the_full_loss():
    g = torch.Generator().manual_seed(1)
    logp, old, adv = (torch.randn(10, generator=g) for _ in range(3))
    norm = pair_normalizer(10, torch.device("cpu"))
    full = flow_loss(logp, old, adv, 0.2, norm).loss
    parts = flow_loss(logp[:3], old[:3], adv[:3], 0.2, norm).loss + flow_loss(logp[3:], old[3:], adv[3:], 0.2, norm).loss
    assert float(parts) == pytest.approx(float(full), rel=1e-6)
