"""TIC-GRPO (Pang et al., arXiv 2508.02833): the trajectory-level importance ratio.

The unbiasedness claim is checked numerically on a two-token "bandit" whose objective and gradient are
exact sums over the 3 x 3 possible sequences: samples come from pi_old, the gradient is wanted at a
different theta (mu > 1, later iterations of one generation batch). The Monte-Carlo mean of TIC-GRPO's
estimator (trajectory ratio, leave-one-out baseline) lands on grad J(theta); plain GRPO's (token ratios,
mean/std advantages) does not, and neither do token ratios with the same baseline.
"""

import math

import pytest
import torch

from grpo.algorithms.advantages import ADVANTAGE_ESTIMATORS
from grpo.algorithms.loss import IMPORTANCE_RATIOS, grpo_loss, trajectory_log_ratio

CPU = torch.device("cpu")
K = 3                                                     # vocabulary of the bandit
REWARD = torch.tensor([[1.0, 0.0, 0.5], [0.0, 2.0, 0.0], [0.3, 0.0, 1.5]], dtype=torch.float64, device=CPU)
THETA_OLD = (torch.tensor([0.2, -0.3, 0.1], dtype=torch.float64, device=CPU),
             torch.tensor([[0.0, 0.5, -0.5], [0.3, -0.2, 0.0], [-0.4, 0.0, 0.4]], dtype=torch.float64, device=CPU))
DELTA = (torch.tensor([0.6, -0.4, 0.2], dtype=torch.float64, device=CPU),
         torch.tensor([[-0.5, 0.4, 0.0], [0.0, 0.6, -0.3], [0.5, -0.5, 0.2]], dtype=torch.float64, device=CPU))


def exact_objective(t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor:
    """J(theta) = sum_{a, b} pi(a) pi(b | a) r(a, b), exactly (float64)."""
    joint = torch.softmax(t1, 0).unsqueeze(1) * torch.softmax(t2, 1)          # [K, K]
    return (joint * REWARD).sum()


def true_gradient() -> torch.Tensor:
    t1, t2 = (THETA_OLD[0] + DELTA[0]).requires_grad_(), (THETA_OLD[1] + DELTA[1]).requires_grad_()
    g1, g2 = torch.autograd.grad(exact_objective(t1, t2), (t1, t2))
    return torch.cat([g1, g2.reshape(-1)])


def estimator_mean(level: str, estimator: str, G: int, groups: int, seed: int) -> torch.Tensor:
    """-grad of the loss over `groups` groups of G sequences sampled from pi_old: the Monte-Carlo mean
    of the estimator (seq-mean-token-sum: the per-sequence gradient is the sum over its tokens)."""
    gen = torch.Generator(device=CPU).manual_seed(seed)
    p1 = torch.softmax(THETA_OLD[0], 0)
    a = torch.multinomial(p1, groups * G, replacement=True, generator=gen)                       # [N]
    b = torch.multinomial(torch.softmax(THETA_OLD[1], 1)[a], 1, generator=gen).squeeze(1)       # [N]
    t1, t2 = (THETA_OLD[0] + DELTA[0]).requires_grad_(), (THETA_OLD[1] + DELTA[1]).requires_grad_()
    logp = torch.stack([torch.log_softmax(t1, 0)[a], torch.log_softmax(t2, 1)[a, b]], dim=1)   # [N, 2]
    old = torch.stack([torch.log_softmax(THETA_OLD[0], 0)[a], torch.log_softmax(THETA_OLD[1], 1)[a, b]], dim=1)
    adv = ADVANTAGE_ESTIMATORS[estimator](REWARD[a, b], G, 0.0).values                          # [N]
    mask = torch.ones_like(logp)
    terms = grpo_loss(logp, old, None, adv, mask, epsilon=1e9, epsilon_high=1e9, beta=0.0,   # no clipping
                      agg_mode="seq-mean-token-sum", normalizer=float(groups * G), importance_sampling_level=level)
    g1, g2 = torch.autograd.grad(terms.loss, (t1, t2))
    return -torch.cat([g1, g2.reshape(-1)])


def monte_carlo(level: str, estimator: str, G: int = 4, batches: int = 8, groups: int = 5_000):
    """Mean and standard error over independent batches."""
    runs = torch.stack([estimator_mean(level, estimator, G, groups, seed) for seed in range(batches)])
    return runs.mean(0), runs.std(0) / math.sqrt(batches)


def z_scores(mean: torch.Tensor, se: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (mean - target).abs() / se.clamp(min=1e-12)


def test_tic_grpo_is_unbiased_for_the_current_policy_gradient():
    truth = true_gradient()
    mean, se = monte_carlo("trajectory", "rloo")
    assert z_scores(mean, se, truth).max() < 4.5, (mean, truth, se)
    assert torch.allclose(mean, truth, atol=0.02)


def test_plain_grpo_is_biased_and_token_ratios_are_the_cause():
    truth = true_gradient()
    mean, se = monte_carlo("token", "grpo")                      # plain GRPO: token ratios, mean/std advantage
    assert z_scores(mean, se, truth).max() > 15
    mean_tok, se_tok = monte_carlo("token", "rloo")              # the same baseline as TIC-GRPO, token ratios
    assert z_scores(mean_tok, se_tok, truth).max() > 15
    assert (mean - truth).abs().max() > 0.05 and (mean_tok - truth).abs().max() > 0.05   # measured: 0.094, 0.077


def test_the_mean_with_self_baseline_scales_the_gradient_by_g_minus_1_over_g():
    """E[w_i (r_i - mean(r)) grad log pi(o_i)] = (G - 1)/G grad J: r_i's own share of the mean is the
    bias; the leave-one-out baseline (rloo) removes it, so the trajectory ratio with rloo is exact."""
    G = 4
    mean, se = monte_carlo("trajectory", "dr_grpo", G=G)
    assert z_scores(mean, se, true_gradient() * (G - 1) / G).max() < 4.5


def test_trajectory_ratio_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, device=CPU)
    old = torch.tensor([[-1.5, -1.0, -9.0]], dtype=torch.float64, device=CPU)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64, device=CPU)   # the third token is padding
    # log w = (-1 + 1.5) + (-2 + 1) = -0.5 on every token (padding excluded from the sum, no 1/|o|)
    assert torch.equal(trajectory_log_ratio(logp, old, mask), torch.full((1, 3), -0.5, dtype=torch.float64))
    assert IMPORTANCE_RATIOS["trajectory"] is trajectory_log_ratio
    # loss with A = 1, eps = 0.2: w = exp(-0.5) = 0.60653 < 0.8, and for A > 0 PPO keeps the unclipped w A
    terms = grpo_loss(logp, old, None, torch.ones(1, dtype=torch.float64), mask, epsilon=0.2, epsilon_high=0.2,
                      beta=0.0, normalizer=1.0, importance_sampling_level="trajectory")
    assert float(terms.loss) == pytest.approx(-math.exp(-0.5), rel=1e-12)
    assert terms.clipped_sum == 0.0


def test_trajectory_gradient_is_w_times_a_on_every_token():
    logp = torch.tensor([[-1.0, -2.0], [-0.3, -0.7]], dtype=torch.float64, device=CPU, requires_grad=True)
    old = torch.tensor([[-1.2, -1.9], [-0.3, -0.2]], dtype=torch.float64, device=CPU)
    adv = torch.tensor([1.5, -0.5], dtype=torch.float64, device=CPU)
    mask = torch.ones(2, 2, dtype=torch.float64, device=CPU)
    terms = grpo_loss(logp, old, None, adv, mask, epsilon=10.0, epsilon_high=10.0, beta=0.0,
                      agg_mode="seq-mean-token-sum", normalizer=2.0, importance_sampling_level="trajectory")
    (grad,) = torch.autograd.grad(terms.loss, logp)
    w = torch.exp((logp.detach() - old).sum(1))                                # [2]: exp(0.1), exp(-0.5)
    assert torch.allclose(grad, (-w * adv / 2).unsqueeze(1).expand(2, 2), rtol=1e-12)


def test_reductions_to_token_ratios():
    """One-token completions: the trajectory ratio is the token ratio. On-policy (pi_old = pi_theta,
    mu = 1): both ratios are 1 with the same gradient, so TIC-GRPO is GRPO."""
    g = torch.Generator(device=CPU).manual_seed(0)
    logp1, old1 = torch.randn(5, 1, generator=g, dtype=torch.float64), torch.randn(5, 1, generator=g, dtype=torch.float64)
    ones = torch.ones(5, 1, dtype=torch.float64)
    assert torch.equal(trajectory_log_ratio(logp1, old1, ones), IMPORTANCE_RATIOS["token"](logp1, old1, ones))
    logp = (-torch.rand(5, 6, generator=g, dtype=torch.float64) * 2).requires_grad_()
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 4, 1, 5])[:, None]).double()
    adv = torch.randn(5, generator=g, dtype=torch.float64)
    grads = []
    for level in ("token", "trajectory"):
        terms = grpo_loss(logp, logp.detach(), None, adv, mask, epsilon=0.2, epsilon_high=0.2, beta=0.0,
                          normalizer=5.0, importance_sampling_level=level)
        grads.append(torch.autograd.grad(terms.loss, logp)[0])
    assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-15)
