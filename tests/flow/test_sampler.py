"""Faithfulness of the flow samplers: noise_level 0 is the ODE sampler, the SDE keeps the ODE's
marginals on the 2-D mixture with its exact velocity, and stored log-probs recompute to ratio 1 exactly."""

import pytest
import torch

from grpo.flow.experience import FlowExperience
from grpo.flow.mixture import default_mixture, mixture_velocity, nearest_component, sample_mixture
from grpo.flow.models import TinyDiT
from grpo.flow.objective import flow_advantages
from grpo.flow.sampler import guided, ode_sample, sde_sample
from grpo.flow.sde import flow_sigma, time_grid
from grpo.flow.update import pair_logprobs, trained_pairs

CPU = torch.device("cpu")


def _random_dit(seed=0):
    torch.manual_seed(seed)
    model = TinyDiT([3, 4, 4], image_size=8, patch=2, dim=32, depth=2, heads=2)
    with torch.no_grad():
        for p in model.parameters():                     # adaLN-zero starts at 0: give every weight a value
            p.normal_(0, 0.1)
    return model


def _all_sde(steps):
    return torch.ones(steps, dtype=torch.bool)


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_noise_level_zero_reproduces_the_ode_sampler_exactly(scale):
    model = _random_dit()
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(6, 3, 8, 8, generator=g)
    cond = torch.randint(0, 3, (6, 3), generator=g)
    times = time_grid(7, CPU)
    sigmas = flow_sigma(times[:-1], 0.0, float(times[1]))
    z = torch.randn(7, 6, 3, 8, 8, generator=g)
    with torch.no_grad():
        ode = ode_sample(guided(model, scale), x1, cond, times)
        traj = sde_sample(guided(model, scale), x1, cond, times, sigmas, _all_sde(7), _all_sde(7), z)
    assert torch.equal(traj.samples, ode)
    with torch.no_grad():                                # and a = 0.7 does differ (the test can fail)
        noisy = sde_sample(guided(model, scale), x1, cond, times, flow_sigma(times[:-1], 0.7, float(times[1])),
                           _all_sde(7), _all_sde(7), z)
    assert not torch.allclose(noisy.samples, ode, atol=1e-3)


def test_sde_marginals_match_the_ode_on_the_gaussian_mixture():
    """Both samplers (100 steps, the exact velocity) against the mixture: the share of each component and the
    per-component mean and spread agree within a few standard errors (n = 6000 each)."""
    mix = default_mixture(dtype=torch.float64)
    vel = lambda x, t, c: mixture_velocity(mix, x, t)   # noqa: E731
    g = torch.Generator().manual_seed(0)
    n, steps = 6000, 60
    times = time_grid(steps, CPU).double()
    sde_mask = _all_sde(steps)
    sde_mask[-1] = False
    ode = ode_sample(vel, torch.randn(n, 2, generator=g, dtype=torch.float64), None, times)
    sde = sde_sample(vel, torch.randn(n, 2, generator=g, dtype=torch.float64), None, times,
                     flow_sigma(times[:-1], 0.7, float(times[1])), sde_mask, sde_mask,
                     torch.randn(steps, n, 2, generator=g, dtype=torch.float64)).samples
    data, _ = sample_mixture(mix, n, g)
    for name, x in (("ode", ode), ("sde", sde)):
        k = nearest_component(mix, x)
        share = torch.bincount(k, minlength=4).double() / n
        se = (mix.weights * (1 - mix.weights) / n).sqrt()
        assert ((share - mix.weights).abs() < 4 * se + 0.005).all(), (name, share)
        for c in range(4):
            pts = x[k == c]
            assert (pts.mean(0) - mix.means[c]).abs().max() < 4 * mix.stds[c] / pts.shape[0] ** 0.5 + 0.02, (name, c)
            assert abs(float(pts.std(0).mean()) - float(mix.stds[c])) < 0.05 * float(mix.stds[c]) + 0.01, (name, c)
    # the two samplers against each other: component shares within the two-sample error
    ks, ko = nearest_component(mix, sde), nearest_component(mix, ode)
    diff = (torch.bincount(ks, minlength=4) - torch.bincount(ko, minlength=4)).double().abs() / n
    assert (diff < 4 * (2 * mix.weights * (1 - mix.weights) / n).sqrt() + 0.005).all()
    # while the SDE paths really are stochastic: the same initial noise gives other samples
    assert torch.cdist(sde[:100], ode[:100]).diag().mean() > 0.05


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_logprobs_recomputed_at_the_same_parameters_give_ratio_exactly_one_whatever_the_batch(scale):
    model = _random_dit(1)
    g = torch.Generator().manual_seed(3)
    n, steps = 6, 4
    times = time_grid(steps, CPU)
    plan = _all_sde(steps)
    plan[-1] = False
    with torch.no_grad():
        traj = sde_sample(guided(model, scale), torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 3, (n, 3), generator=g),
                          times, flow_sigma(times[:-1], 0.7, float(times[1])), plan, plan,
                          torch.randn(steps, n, 3, 8, 8, generator=g))
    rewards = torch.arange(n, dtype=torch.float32)
    exp = FlowExperience(traj, [None] * n, rewards, flow_advantages(rewards, 3))
    rows, st = trained_pairs(exp)
    assert rows.numel() == n * (steps - 1)
    for batch in (1, 7, rows.numel()):
        perm = torch.randperm(rows.numel(), generator=g)        # pairs mixed across samples and steps
        with torch.no_grad():
            logp = torch.cat([pair_logprobs(model, exp, rows[perm[i:i + batch]], st[perm[i:i + batch]], scale, "mean")
                              for i in range(0, rows.numel(), batch)])
        ratio = torch.exp(logp - traj.logprobs[rows[perm], st[perm]])
        assert torch.equal(ratio, torch.ones_like(ratio)), batch
    assert (traj.logprobs[:, -1] == 0).all()                   # the final ODE step carries no log-prob
