"""The policy-loss registry (grpo/algorithms/policy_losses.py): clip with delta, CISPO, SAPO and VESPO against
float64 formulas, hand-derived values and gradients, and through grpo_loss's aggregation."""

import math

import pytest
import torch

from grpo.algorithms.loss import grpo_loss
from grpo.algorithms.policy_losses import POLICY_LOSSES, PolicyLossParams, vespo_weights

D = torch.float64


def inputs(seed=0, n=4, T=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(n, T, generator=g, dtype=D) * 3).requires_grad_()
    old = (logp.detach() + torch.randn(n, T, generator=g, dtype=D) * 0.6)
    adv = torch.tensor([1.5, -0.7, 0.3, -2.0], dtype=D)[:n]
    mask = torch.ones(n, T, dtype=D)
    mask[1, 3:] = 0
    return logp, old, adv, mask


def run(name, logp, old, adv, mask, **params):
    p = PolicyLossParams(**params)
    return POLICY_LOSSES[name](logp - old, logp, logp - old, adv, mask, p)


def test_clip_delta_caps_the_unclipped_ratio_of_negative_advantages():
    lr = torch.log(torch.tensor([[3.0, 3.0]], dtype=D))
    adv = torch.tensor([[-1.0, 1.0]], dtype=D)
    plain = POLICY_LOSSES["clip"](lr, None, lr, adv, None, PolicyLossParams())
    capped = POLICY_LOSSES["clip"](lr, None, lr, adv, None, PolicyLossParams(clip_delta=2.0))
    assert plain.loss[0].tolist() == pytest.approx([3.0, -1.2])       # max(-3 x -1, -1.2 x -1) = 3; A > 0: -1.2
    assert capped.loss[0].tolist() == pytest.approx([2.0, -1.2])      # -min(3, 2) x -1 = 2


def test_cispo_weights_the_log_prob_by_the_detached_capped_ratio():
    logp, old, adv, mask = inputs()
    sur = run("cispo", logp, old, adv, mask, cispo_max=1.3)
    r = torch.exp(logp.detach() - old)
    w = torch.clamp(r, max=1.3)
    assert torch.allclose(sur.loss, -w * adv[:, None] * logp)
    sur.loss.sum().backward()
    assert torch.allclose(logp.grad, -w * adv[:, None])              # every token keeps a gradient
    assert torch.equal(sur.clipped, (r > 1.3) & (adv[:, None] > 0))
    assert sur.clipped.any() and not sur.dual_clipped.any()


def test_sapo_is_a_soft_gate_with_grpos_gradient_on_policy():
    logp, old, adv, mask = inputs()
    sur = run("sapo", logp, old, adv, mask, sapo_tau_pos=1.0, sapo_tau_neg=1.5)
    r = torch.exp(logp.detach() - old)
    tau = torch.where(adv > 0, 1.0, 1.5).to(D)[:, None]
    s = torch.sigmoid(tau * (r - 1))
    assert torch.allclose(sur.loss, -(4 / tau) * s * adv[:, None])
    sur.loss.sum().backward()
    assert torch.allclose(logp.grad, -4 * s * (1 - s) * r * adv[:, None])   # d/dlogp = d/dr x r
    on = logp.detach().clone().requires_grad_()
    run("sapo", on, on.detach(), adv, mask).loss.sum().backward()        # r = 1: sigmoid' x 4 = 1
    assert torch.allclose(on.grad, -adv[:, None].expand_as(on))


def test_vespo_gamma_weight_hand_values():
    p = PolicyLossParams()                    # (k, lambda) = (2, 3) for A >= 0, (3, 2) for A < 0
    log_r = torch.tensor([[math.log(2.0), 0.0], [math.log(2.0), 0.0], [0.0, 0.0]], dtype=D)   # w = 2, 2, 1
    mask = torch.ones(3, 2, dtype=D)
    phi = vespo_weights(log_r, torch.tensor([1.0, -1.0, 0.5], dtype=D), mask, p).squeeze(1)
    assert phi.tolist() == pytest.approx([4 * math.exp(-3), 8 * math.exp(-2), 1.0])   # phi(1) = 1
    masked = vespo_weights(log_r, torch.tensor([1.0, -1.0, 0.5], dtype=D), torch.tensor([[0.0, 1.0]] * 3, dtype=D), p)
    assert masked.squeeze(1).tolist() == pytest.approx([1.0, 1.0, 1.0])              # masked tokens do not count


def test_vespo_loss_and_gradient():
    logp, old, adv, mask = inputs()
    sur = run("vespo", logp, old, adv, mask)
    log_w = ((logp.detach() - old) * mask).sum(1, keepdim=True)
    k = torch.where(adv >= 0, 2.0, 3.0).to(D)[:, None]
    lam = torch.where(adv >= 0, 3.0, 2.0).to(D)[:, None]
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    assert torch.allclose(sur.loss, -phi * adv[:, None] * logp)
    sur.loss.sum().backward()
    assert torch.allclose(logp.grad, -phi * adv[:, None].expand_as(logp))


@pytest.mark.parametrize("name", ["clip", "cispo", "sapo", "vespo"])
def test_grpo_loss_aggregates_every_policy_loss_alike(name):
    """Token-mean of the per-token policy term, with the KL term added, as a direct float64 computation."""
    logp, old, adv, mask = inputs(1)
    ref = logp.detach() - 0.1
    terms = grpo_loss(logp, old, ref, adv, mask, epsilon=0.2, epsilon_high=0.28, beta=0.04, agg_mode="token-mean",
                      normalizer=float(mask.sum()), policy_loss=name, policy_params=PolicyLossParams(cispo_max=1.2))
    per_token = POLICY_LOSSES[name](logp - old, logp, logp - old, adv, mask,
                                    PolicyLossParams(eps_low=0.2, eps_high=0.28, cispo_max=1.2)).loss
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    expected = ((per_token + 0.04 * kl) * mask).sum() / mask.sum()
    assert terms.loss.item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize("name", ["cispo", "sapo", "vespo"])
def test_on_policy_every_policy_loss_has_grpos_gradient(name):
    """With pi_old = pi_theta (num_iterations 1) every ratio is 1: CISPO's weight min(1, cap) = 1, SAPO's gate
    slope 1, VESPO's phi(1) = 1, so the gradient is the clip loss's, -A grad log pi, token for token."""
    logp, _, adv, mask = inputs(2)
    grads = []
    for loss_name in ("clip", name):
        x = logp.detach().clone().requires_grad_()
        grpo_loss(x, x.detach(), None, adv, mask, epsilon=0.2, epsilon_high=0.28, beta=0.0, agg_mode="token-mean",
                  normalizer=float(mask.sum()), policy_loss=loss_name).loss.backward()
        grads.append(x.grad)
    assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-12)
    assert torch.allclose(grads[0], -adv[:, None] * mask / mask.sum())


@pytest.mark.parametrize("entry, given, field, value", [
    ("cispo", {"max": 2.5}, "cispo_max", 2.5), ("sapo", {"tau_neg": 1.3}, "sapo_tau_neg", 1.3),
    ("clip", {"delta": 4.0}, "clip_delta", 4.0), ("vespo", {"k_pos": 1.5}, "vespo_k_pos", 1.5),
])
def test_params_take_the_entry_parameters_under_the_entry_prefix(entry, given, field, value):
    from grpo.config import build_config

    loss = build_config(overrides={"algorithm.policy_loss": {"name": entry, **given}}).algorithm.policy_loss
    p = PolicyLossParams.of_entry(loss.name, loss.params)
    assert getattr(p, field) == value
    assert (p.sapo_tau_pos, p.eps_low) == (1.0, 0.2)                                 # untouched: defaults
    if entry != "vespo":
        assert p.vespo_lambda_neg == 2.0
