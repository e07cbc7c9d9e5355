"""The SDE math of grpo/flow/sde.py against hand-derived numbers and direct float64 implementations."""

import math

import pytest
import torch

from grpo.flow.sde import (cfg_velocity, constant_sigma, flow_sigma, gaussian_kl, gaussian_logprob, ode_step,
                           sde_mean, sde_sample, sde_std, time_grid)


def test_time_grid_is_uniform_from_one_to_zero_and_shift_moves_it_to_high_noise():
    assert torch.equal(time_grid(4, torch.device("cpu")), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    shifted = time_grid(4, torch.device("cpu"), shift=3.0)
    # t' = 3 t / (1 + 2 t): 0.5 -> 1.5 / 2 = 0.75
    assert shifted[2].item() == pytest.approx(0.75)
    assert shifted[0].item() == 1.0 and shifted[-1].item() == 0.0
    with pytest.raises(ValueError, match="num_steps"):
        time_grid(0, torch.device("cpu"))


def test_flow_sigma_formula_and_clamped_endpoint():
    t = torch.tensor([0.5, 0.2, 1.0])
    s = flow_sigma(t, 0.7, t_max=0.9)
    # 0.7 sqrt(0.5 / 0.5) = 0.7; 0.7 sqrt(0.2 / 0.8) = 0.35; t = 1: 0.7 sqrt(1 / (1 - 0.9)) = 0.7 sqrt(10)
    assert s.tolist() == pytest.approx([0.7, 0.35, 0.7 * math.sqrt(10)], rel=1e-6)
    assert torch.isfinite(s).all()
    assert constant_sigma(t, 0.3, 0.9).tolist() == pytest.approx([0.3, 0.3, 0.3])


def test_sde_mean_hand_computed():
    # x = 1, v = 2, t = 0.5, h = 0.1, sigma = 1: mu = 1 - 0.1 [2 + 1 / (2 * 0.5) (1 + 0.5 * 2)] = 1 - 0.1 * 4 = 0.6
    mu = sde_mean(torch.tensor([[1.0]]), torch.tensor([[2.0]]), 0.5, 0.1, 1.0)
    assert mu.item() == pytest.approx(0.6)
    # per-row t, h, sigma broadcast over the other dims
    x, v = torch.ones(2, 3), torch.full((2, 3), 2.0)
    mu = sde_mean(x, v, torch.tensor([0.5, 0.5]), torch.tensor([0.1, 0.2]), torch.tensor([1.0, 0.0]))
    assert mu[0].tolist() == pytest.approx([0.6] * 3)
    assert mu[1].tolist() == pytest.approx([1 - 0.2 * 2] * 3)


def test_sigma_zero_gives_the_ode_step_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    x, v, z = (torch.randn(5, 3, 4, 4, generator=g) for _ in range(3))
    h, t = torch.full((5,), 0.1), torch.rand(5, generator=g) * 0.9 + 0.05
    sig = torch.zeros(5)
    assert torch.equal(sde_sample(sde_mean(x, v, t, h, sig), sde_std(sig, h), z), ode_step(x, v, h))


def test_gaussian_logprob_matches_float64_normal_for_mean_and_sum():
    g = torch.Generator().manual_seed(1)
    x, mu = torch.randn(4, 3, 2, 2, generator=g), torch.randn(4, 3, 2, 2, generator=g)
    std = torch.tensor([0.1, 0.5, 1.0, 2.0])
    ref = torch.distributions.Normal(mu.double(), std.double().view(-1, 1, 1, 1)).log_prob(x.double()).flatten(1)
    assert torch.allclose(gaussian_logprob(x, mu, std, "sum").double(), ref.sum(1), rtol=1e-5)
    assert torch.allclose(gaussian_logprob(x, mu, std, "mean").double(), ref.mean(1), rtol=1e-5)
    assert gaussian_logprob(x.bfloat16(), mu.bfloat16(), std).dtype == torch.float32    # computed in fp32
    with pytest.raises(ValueError, match="flow.logprob_reduction"):
        gaussian_logprob(x, mu, std, "max")


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_closed_form_kl_matches_a_monte_carlo_estimate(reduction):
    """KL(N(mu, s^2 I) || N(mu_ref, s^2 I)) = E_{x ~ p}[log p(x) - log q(x)], estimated with 200k draws."""
    g = torch.Generator().manual_seed(2)
    d, n = 12, 200_000
    mu, mu_ref = torch.randn(1, d, generator=g, dtype=torch.float64), torch.randn(1, d, generator=g, dtype=torch.float64)
    s = 0.8
    x = mu + s * torch.randn(n, d, generator=g, dtype=torch.float64)
    mc = gaussian_logprob(x, mu.expand(n, d), s, reduction) - gaussian_logprob(x, mu_ref.expand(n, d), s, reduction)
    closed = gaussian_kl(mu, mu_ref, s, reduction).item()
    # hand: sum_d (mu - mu_ref)^2 / (2 s^2), divided by d for the mean reduction
    hand = float(((mu - mu_ref) ** 2).sum() / (2 * s * s)) / (d if reduction == "mean" else 1)
    assert closed == pytest.approx(hand, rel=1e-5)
    se = float(mc.double().std()) / math.sqrt(n)
    assert abs(float(mc.double().mean()) - closed) < 4 * se


def test_cfg_velocity():
    vc, vu = torch.tensor([3.0]), torch.tensor([1.0])
    assert cfg_velocity(vc, vu, 1.0).item() == 3.0
    assert cfg_velocity(vc, vu, 4.0).item() == 1.0 + 4.0 * 2.0
