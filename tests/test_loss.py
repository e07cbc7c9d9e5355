import math

import pytest
import torch

from grpo.loss import AGGREGATIONS, KL_ESTIMATORS, clipped_surrogate, grpo_loss, kl_k3, masked_mean


def reference_grpo_loss(logp, old, ref, adv, mask, eps_low, eps_high, beta):
    """DeepSeekMath eq. 3 as a loss, in float64 with Python loops (no tensor ops)."""
    total = 0.0
    for i in range(len(logp)):
        terms = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            ratio = math.exp(logp[i][t] - old[i][t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            surrogate = min(ratio * adv[i], clipped * adv[i])
            d = ref[i][t] - logp[i][t]
            kl = math.exp(d) - d - 1
            terms.append(-surrogate + beta * kl)
        total += sum(terms) / max(len(terms), 1)
    return total / len(logp)


def random_inputs(N=5, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.3
    ref = logp + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    lengths = torch.tensor([7, 1, 4, 6, 3])[:N]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("eps_low,eps_high,beta", [(0.2, 0.2, 0.04), (0.2, 0.28, 0.0), (0.1, 0.3, 0.5)])
def test_grpo_loss_matches_float64_reference(eps_low, eps_high, beta):
    logp, old, ref, adv, mask = random_inputs()
    got = grpo_loss(logp, old, ref, adv, mask, epsilon=eps_low, epsilon_high=eps_high, beta=beta,
                    normalizer=AGGREGATIONS["seq-mean-token-mean"].normalizer(mask, 7))
    want = reference_grpo_loss(logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(),
                               eps_low, eps_high, beta)
    assert float(got.loss) == pytest.approx(want, abs=1e-10)


def test_k3_hand_values():
    # d = ref - logp = ln 2: exp(d) - d - 1 = 2 - 0.693147 - 1 = 0.306853
    logp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[math.log(2.0), -1.0]])
    assert torch.allclose(kl_k3(logp, ref), torch.tensor([[0.306853, 0.0]]), atol=1e-6)
    # k3 is never negative
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert (kl_k3(x, torch.zeros_like(x)) >= 0).all()
    assert set(KL_ESTIMATORS) >= {"k1", "k2", "k3"}


def test_clipping_hand_values():
    # ratios 1.5 and 0.5 (log-ratio ln 1.5, ln 0.5), eps 0.2
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    # A = +1: min(1.5, 1.2) = 1.2 (clipped), min(0.5, 0.8) = 0.5 (unclipped) -> loss [-1.2, -0.5]
    loss, clipped = clipped_surrogate(logp, old, torch.tensor([1.0]), 0.2, 0.2)
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5]]))
    assert clipped.tolist() == [[True, False]]
    # A = -1: min(-1.5, -1.2) = -1.5 (unclipped), min(-0.5, -0.8) = -0.8 (clipped) -> loss [1.5, 0.8]
    loss, clipped = clipped_surrogate(logp, old, torch.tensor([-1.0]), 0.2, 0.2)
    assert torch.allclose(loss, torch.tensor([[1.5, 0.8]]))
    assert clipped.tolist() == [[False, True]]
    # Clip-Higher: eps_high 0.6 lets ratio 1.5 through for A = +1
    loss, _ = clipped_surrogate(logp, old, torch.tensor([1.0]), 0.2, 0.6)
    assert torch.allclose(loss, torch.tensor([[-1.5, -0.5]]))


def test_seq_mean_token_mean_hand_values():
    # completion 1: tokens [1, 3] -> mean 2; completion 2: token [4] -> mean 4; mean over completions = 3
    values = torch.tensor([[1.0, 3.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    agg = AGGREGATIONS["seq-mean-token-mean"]
    assert float(agg.numerator(values, mask) / agg.normalizer(mask, 3)) == pytest.approx(3.0)
    # token-mean: (1 + 3 + 4) / 3
    agg = AGGREGATIONS["token-mean"]
    assert float(agg.numerator(values, mask) / agg.normalizer(mask, 3)) == pytest.approx(8 / 3)
    assert float(masked_mean(values, mask)) == pytest.approx(8 / 3)


def test_right_padding_does_not_change_the_loss():
    logp, old, ref, adv, mask = random_inputs()
    pad = lambda t, v: torch.cat([t, torch.full((t.shape[0], 4), v, dtype=t.dtype)], dim=1)  # noqa: E731
    kw = dict(epsilon=0.2, epsilon_high=0.2, beta=0.04, normalizer=5.0)
    a = grpo_loss(logp, old, ref, adv, mask, **kw)
    b = grpo_loss(pad(logp, -7.0), pad(old, 3.0), pad(ref, 11.0), adv, pad(mask, 0.0), **kw)
    assert float(a.loss) == pytest.approx(float(b.loss), abs=1e-12)
    assert a.tokens == b.tokens and a.clipped_sum == b.clipped_sum


def test_beta_zero_needs_no_reference_and_beta_positive_does():
    logp, old, _, adv, mask = random_inputs()
    out = grpo_loss(logp, old, None, adv, mask, epsilon=0.2, epsilon_high=None, beta=0.0, normalizer=5.0)
    assert out.kl_term == 0.0
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss(logp, old, None, adv, mask, epsilon=0.2, epsilon_high=None, beta=0.1, normalizer=5.0)


def test_kl_is_added_to_the_loss_not_the_advantage():
    # with ratio 1 and A = 0, the loss is exactly beta * mean_i mean_t k3
    logp, _, ref, _, mask = random_inputs()
    out = grpo_loss(logp, logp, ref, torch.zeros(5, dtype=torch.float64), mask, epsilon=0.2,
                    epsilon_high=None, beta=0.5, normalizer=5.0)
    k3 = kl_k3(logp, ref)
    want = 0.5 * sum(float((k3[i] * mask[i]).sum() / mask[i].sum()) for i in range(5)) / 5
    assert float(out.loss) == pytest.approx(want, abs=1e-12)


def reference_aggregate(values, mask, mode, L):
    """Each aggregation mode written out in float64 with Python loops."""
    rows = [[v for v, m in zip(vr, mr) if m] for vr, mr in zip(values, mask)]
    N = len(rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / max(len(r), 1) for r in rows) / N
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / max(sum(len(r) for r in rows), 1)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / N
    if mode == "seq-mean-token-sum-norm":
        return sum(sum(r) / L for r in rows) / N
    raise KeyError(mode)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_every_aggregation_matches_reference_and_micro_batches_add_up(mode):
    logp, old, ref, adv, mask = random_inputs()
    mask[1] = 0.0                                              # an empty completion
    kw = dict(epsilon=0.2, epsilon_high=0.28, beta=0.04, kl_estimator="k3", agg_mode=mode)
    agg = AGGREGATIONS[mode]
    normalizer = agg.normalizer(mask, 10)
    full = grpo_loss(logp, old, ref, adv, mask, normalizer=normalizer, **kw)
    per_token = (clipped_surrogate(logp, old, adv, 0.2, 0.28)[0] + 0.04 * kl_k3(logp, ref)).tolist()
    assert float(full.loss) == pytest.approx(reference_aggregate(per_token, mask.tolist(), mode, 10), abs=1e-10)
    parts = [grpo_loss(logp[s], old[s], ref[s], adv[s], mask[s], normalizer=normalizer, **kw)
             for s in (slice(0, 2), slice(2, 3), slice(3, 5))]
    assert sum(float(p.loss) for p in parts) == pytest.approx(float(full.loss), abs=1e-12)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_match_formulas(name):
    g = torch.Generator().manual_seed(4)
    logp = -torch.rand(50, generator=g, dtype=torch.float64) * 4
    ref = -torch.rand(50, generator=g, dtype=torch.float64) * 4
    formulas = {"k1": lambda p, q: p - q, "k2": lambda p, q: 0.5 * (p - q) ** 2,
                "k3": lambda p, q: math.exp(q - p) - (q - p) - 1}
    want = torch.tensor([formulas[name](p, q) for p, q in zip(logp.tolist(), ref.tolist())], dtype=torch.float64)
    assert torch.allclose(KL_ESTIMATORS[name](logp, ref), want, atol=1e-12)
