"""G = 2 and DPO ("It Takes Two: Your GRPO Is Secretly DPO", Wu et al., arXiv 2510.00977).

With G = 2, a pair with different rewards r_w > r_l gets A_w = -A_l = (d/2) / (d/sqrt(2) + eps) ~ 1/sqrt(2)
(d = r_w - r_l, unbiased std d/sqrt(2)). With mu = 1 (ratio 1, nothing clipped), the token-sum
aggregation and pi_theta = pi_ref, GRPO's gradient, KL term included, is

    grad L_GRPO = -(A_w / 2) [grad log pi(o_w) - grad log pi(o_l)]       (the k3 gradient is 0 at pi = pi_ref)

and the DPO loss over the sampled pair, L_DPO = -log sigmoid(b [(log pi(o_w) - log ref(o_w)) - (log pi(o_l)
- log ref(o_l))]), has at pi = pi_ref the gradient -(b / 2) [grad log pi(o_w) - grad log pi(o_l)]: the
same with b = A_w. docs/variants.md, "G = 2 and DPO", states the conditions.
"""

import math

import torch

from grpo.algorithms.advantages import grpo_advantages
from grpo.algorithms.loss import grpo_loss

CPU = torch.device("cpu")
K = 4


def policy_logps(t1, t2, seqs):
    """log pi of each token of each 2-token sequence (a, b): [2, 2]."""
    a, b = seqs[:, 0], seqs[:, 1]
    return torch.stack([torch.log_softmax(t1, 0)[a], torch.log_softmax(t2, 1)[a, b]], dim=1)


def setup(shift: float):
    g = torch.Generator(device=CPU).manual_seed(0)
    ref1, ref2 = torch.randn(K, generator=g, dtype=torch.float64), torch.randn(K, K, generator=g, dtype=torch.float64)
    t1 = (ref1 + shift * torch.randn(K, generator=g, dtype=torch.float64)).requires_grad_()
    t2 = (ref2 + shift * torch.randn(K, K, generator=g, dtype=torch.float64)).requires_grad_()
    seqs = torch.tensor([[1, 3], [2, 0]], device=CPU)          # o_w, o_l
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64, device=CPU)   # o_l has one token
    return (ref1, ref2), (t1, t2), seqs, mask


def grpo_grad(theta, ref, seqs, mask, rewards, beta, agg="seq-mean-token-sum"):
    logp = policy_logps(*theta, seqs)
    ref_logp = policy_logps(*ref, seqs)
    adv = grpo_advantages(rewards, 2).values
    terms = grpo_loss(logp, logp.detach(), ref_logp, adv, mask, epsilon=0.2, epsilon_high=0.2, beta=beta,
                      agg_mode=agg, normalizer=2.0)              # mu = 1: pi_old = pi_theta.detach()
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(terms.loss, theta)]), adv


def dpo_grad(theta, ref, seqs, mask, b, length_normalised=False):
    logp = (policy_logps(*theta, seqs) * mask).sum(1)
    ref_logp = (policy_logps(*ref, seqs) * mask).sum(1)
    if length_normalised:
        logp, ref_logp = logp / mask.sum(1), ref_logp / mask.sum(1)
    h = b * ((logp[0] - ref_logp[0]) - (logp[1] - ref_logp[1]))
    loss = -torch.nn.functional.logsigmoid(h)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, theta)])


def test_g2_advantage_is_plus_minus_one_over_sqrt2():
    adv = grpo_advantages(torch.tensor([3.0, 1.0], dtype=torch.float64), 2, eps=0.0).values
    assert torch.allclose(adv, torch.tensor([1, -1], dtype=torch.float64) / math.sqrt(2), rtol=1e-12)


def test_grpo_with_g2_and_kl_is_the_dpo_gradient_at_the_reference():
    ref, theta, seqs, mask = setup(shift=0.0)
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    g_grpo, adv = grpo_grad(theta, ref, seqs, mask, rewards, beta=0.04)
    b = float(adv[0])                                            # 0.5 / (1/sqrt(2) + 1e-4)
    assert math.isclose(b, 0.5 / (1 / math.sqrt(2) + 1e-4), rel_tol=1e-12)
    assert torch.allclose(g_grpo, dpo_grad(theta, ref, seqs, mask, b), rtol=1e-10, atol=1e-14)
    # the KL term contributes nothing there: beta = 0 gives the same gradient
    assert torch.allclose(g_grpo, grpo_grad(theta, ref, seqs, mask, rewards, beta=0.0)[0], rtol=0, atol=1e-15)


def test_per_completion_token_mean_is_dpo_on_length_normalised_logprobs():
    ref, theta, seqs, mask = setup(shift=0.0)
    rewards = torch.tensor([0.0, 2.0], dtype=torch.float64)     # the second completion wins here
    g_grpo, adv = grpo_grad(theta, ref, seqs, mask, rewards, beta=0.04, agg="seq-mean-token-mean")
    swapped = seqs.flip(0), mask.flip(0)
    b = float(adv[1])
    assert torch.allclose(g_grpo, dpo_grad(theta, ref, *swapped, b, length_normalised=True), rtol=1e-10, atol=1e-14)


def test_away_from_the_reference_the_two_differ():
    """The conditions matter: once pi_theta != pi_ref, DPO's weight sigmoid(-h) moves off 1/2 and the k3
    gradient is no longer 0, and they do not cancel."""
    ref, theta, seqs, mask = setup(shift=0.5)
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    g_grpo, adv = grpo_grad(theta, ref, seqs, mask, rewards, beta=0.04)
    assert (g_grpo - dpo_grad(theta, ref, seqs, mask, float(adv[0]))).abs().max() > 1e-3
