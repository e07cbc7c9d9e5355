import math

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.algorithms.loss import (AGGREGATIONS, IMPORTANCE_RATIOS, KL_ESTIMATORS, grpo_loss, kl_k3,
                       policy_surrogate)


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


def clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, clip_ratio_c=None):
    """policy_surrogate with the per-token ratio exp(logp - old_logp): (loss [n, T], clipped [n, T])."""
    s = policy_surrogate(logp - old_logp, advantages, eps_low, eps_high, clip_ratio_c)
    return s.loss, s.clipped


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


# ---------------------------------------------------------------- importance ratio level (GSPO)


def test_token_log_ratio_and_registry():
    logp, old, _, _, mask = random_inputs()
    assert torch.equal(IMPORTANCE_RATIOS["token"](logp, old, mask), logp - old)
    assert set(IMPORTANCE_RATIOS) == {"token", "sequence", "trajectory"}


def test_sequence_log_ratio_value_is_the_length_normalised_sequence_ratio():
    logp, old, _, _, mask = random_inputs()
    got = IMPORTANCE_RATIOS["sequence"](logp, old, mask)
    for i in range(5):
        n = int(mask[i].sum())
        log_s = sum(float(logp[i, t] - old[i, t]) for t in range(n)) / n
        assert torch.allclose(got[i], torch.full((7,), log_s, dtype=torch.float64), atol=1e-12)


def gspo_sequence_loss(logp, old, adv, mask, eps_low, eps_high):
    """GSPO's sequence objective, directly: 1/N sum_i -min(s_i A_i, clip(s_i) A_i), s_i computed per
    sequence from a Python loop over its tokens (float64, autograd through logp)."""
    total = 0.0
    for i in range(logp.shape[0]):
        toks = [t for t in range(logp.shape[1]) if mask[i, t]]
        s = torch.exp(sum(logp[i, t] - old[i, t] for t in toks) / len(toks))
        total = total - torch.minimum(s * adv[i], torch.clamp(s, 1 - eps_low, 1 + eps_high) * adv[i])
    return total / logp.shape[0]


def test_gspo_token_value_and_gradient_equal_the_sequence_objective():
    logp, old, _, adv, mask = random_inputs(seed=3)
    old = logp.detach() + torch.randn(logp.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 0.05
    eps_low, eps_high = 0.01, 0.015                        # tight GSPO-like clip: some sequences are clipped
    a = logp.clone().requires_grad_(True)
    got = grpo_loss(a, old, None, adv, mask, epsilon=eps_low, epsilon_high=eps_high, beta=0.0,
                    normalizer=5.0, importance_sampling_level="sequence")
    got.loss.backward()
    b = logp.clone().requires_grad_(True)
    want = gspo_sequence_loss(b, old, adv, mask, eps_low, eps_high)
    want.backward()
    assert float(got.loss.detach()) == pytest.approx(float(want.detach()), abs=1e-12)
    assert torch.allclose(a.grad, b.grad, atol=1e-12)
    assert 0 < got.clipped_sum < got.tokens               # both clipped and unclipped sequences occur
    # a clipped sequence has all of its tokens clipped and no gradient
    s = ((logp - old) * mask).sum(1) / mask.sum(1)
    clipped_rows = ((s.exp() > 1 + eps_high) & (adv > 0)) | ((s.exp() < 1 - eps_low) & (adv < 0))
    assert got.clipped_sum == pytest.approx(float(mask[clipped_rows].sum()))
    assert (a.grad[clipped_rows] == 0).all() and (a.grad[~clipped_rows] * mask[~clipped_rows] != 0).any()

# ---------------------------------------------------------------- dual clip


def reference_dual_clip(logp, old, adv, mask, eps_low, eps_high, c):
    """Per-token loss with dual clip (Ye et al. 2020), float64 loops; returns (seq-mean-token-mean, count)."""
    total, dual = 0.0, 0
    for i in range(len(logp)):
        terms = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            r = math.exp(logp[i][t] - old[i][t])
            loss = max(-r * adv[i], -min(max(r, 1 - eps_low), 1 + eps_high) * adv[i])
            if adv[i] < 0 and -c * adv[i] < loss:
                loss, dual = -c * adv[i], dual + 1
            terms.append(loss)
        total += sum(terms) / max(len(terms), 1)
    return total / len(logp), dual


def test_dual_clip_hand_values():
    # ratios 4 and 2, A = -1, c = 3: standard losses 4 and 2; the first is capped at 3
    logp, old = torch.log(torch.tensor([[4.0, 2.0, 0.5]])), torch.zeros(1, 3)
    s = policy_surrogate(logp - old, torch.tensor([-1.0]), 0.2, 0.2, clip_ratio_c=3.0)
    assert torch.allclose(s.loss, torch.tensor([[3.0, 2.0, 0.8]]))
    assert s.dual_clipped.tolist() == [[True, False, False]]
    assert s.clipped.tolist() == [[False, False, True]]
    # positive advantages are never dual-clipped
    s = policy_surrogate(logp - old, torch.tensor([1.0]), 0.2, 0.2, clip_ratio_c=3.0)
    assert torch.allclose(s.loss, torch.tensor([[-1.2, -1.2, -0.5]])) and not s.dual_clipped.any()


def test_dual_clip_matches_reference_and_has_no_gradient_on_capped_tokens():
    logp, old, _, adv, mask = random_inputs(seed=5)
    old = logp - torch.rand(logp.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2
    a = logp.clone().requires_grad_(True)
    got = grpo_loss(a, old, None, adv, mask, epsilon=0.2, epsilon_high=0.28, beta=0.0, clip_ratio_c=3.0,
                    normalizer=5.0)
    want, dual = reference_dual_clip(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28, 3.0)
    assert float(got.loss.detach()) == pytest.approx(want, abs=1e-12)
    assert got.dual_clipped_sum == dual and dual > 0
    got.loss.backward()
    capped = (adv[:, None] < 0) & ((logp - old).exp() > 3.0) & (mask > 0)
    assert (a.grad[capped] == 0).all()
    # off by default: the same inputs without c give a larger loss
    plain = grpo_loss(logp, old, None, adv, mask, epsilon=0.2, epsilon_high=0.28, beta=0.0, normalizer=5.0)
    assert float(plain.loss) > float(got.loss.detach()) and plain.dual_clipped_sum == 0

# ---------------------------------------------------------------- per-token advantages


def test_per_token_advantages_match_reference_and_broadcast_equals_per_completion():
    logp, old, ref, adv, mask = random_inputs(seed=6)
    kw = dict(epsilon=0.2, epsilon_high=0.28, beta=0.0, normalizer=5.0)
    per_token = adv[:, None].expand(-1, 7).contiguous()
    assert float(grpo_loss(logp, old, ref, per_token, mask, **kw).loss) == pytest.approx(
        float(grpo_loss(logp, old, ref, adv, mask, **kw).loss), abs=1e-14)
    tok_adv = torch.randn(5, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = grpo_loss(logp, old, ref, tok_adv, mask, clip_ratio_c=3.0, **kw)
    L, A, O, M = logp.tolist(), tok_adv.tolist(), old.tolist(), mask.tolist()
    want = 0.0
    for i in range(5):
        terms = []
        for t in range(7):
            if M[i][t]:
                r = math.exp(L[i][t] - O[i][t])
                loss = max(-r * A[i][t], -min(max(r, 0.8), 1.28) * A[i][t])
                terms.append(min(loss, -3.0 * A[i][t]) if A[i][t] < 0 else loss)
        want += sum(terms) / len(terms)
    assert float(got.loss) == pytest.approx(want / 5, abs=1e-12)
    loss, _ = clipped_surrogate(logp, old, tok_adv, 0.2, 0.28)
    assert loss.shape == (5, 7)

# ---------------------------------------------------------------- entropy bonus


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_entropy_bonus_is_subtracted_with_the_policy_aggregation(mode):
    logp, old, ref, adv, mask = random_inputs(seed=8)
    entropy = torch.rand(5, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2
    normalizer = AGGREGATIONS[mode].normalizer(mask, 10)
    kw = dict(epsilon=0.2, epsilon_high=0.2, beta=0.04, agg_mode=mode, normalizer=normalizer)
    base = grpo_loss(logp, old, ref, adv, mask, **kw)
    e = entropy.clone().requires_grad_(True)
    got = grpo_loss(logp, old, ref, adv, mask, entropy=e, entropy_coef=0.01, **kw)
    agg_h = reference_aggregate(entropy.tolist(), mask.tolist(), mode, 10)
    assert float(got.loss.detach()) == pytest.approx(float(base.loss) - 0.01 * agg_h, abs=1e-12)
    assert got.entropy_term == pytest.approx(-0.01 * agg_h, abs=1e-12)
    got.loss.backward()
    assert (e.grad[mask == 0] == 0).all() and (e.grad[mask > 0] < 0).all()   # more entropy, lower loss
    with pytest.raises(ValueError, match="needs the entropy"):
        grpo_loss(logp, old, ref, adv, mask, entropy_coef=0.01, **kw)


def test_micro_batches_add_up_with_every_new_option():
    logp, old, ref, _, mask = random_inputs(seed=10)
    mask[2] = 0.0
    tok_adv = torch.randn(5, 7, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    entropy = torch.rand(5, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for level in IMPORTANCE_RATIOS:
        for mode in AGGREGATIONS:
            kw = dict(epsilon=0.2, epsilon_high=0.28, beta=0.04, agg_mode=mode, importance_sampling_level=level,
                      clip_ratio_c=2.0, entropy_coef=0.003, normalizer=AGGREGATIONS[mode].normalizer(mask, 9))
            full = grpo_loss(logp, old, ref, tok_adv, mask, entropy=entropy, **kw)
            parts = [grpo_loss(logp[s], old[s], ref[s], tok_adv[s], mask[s], entropy=entropy[s], **kw)
                     for s in (slice(0, 1), slice(1, 4), slice(4, 5))]
            assert sum(float(p.loss) for p in parts) == pytest.approx(float(full.loss), abs=1e-12)
            assert sum(p.dual_clipped_sum for p in parts) == full.dual_clipped_sum
            assert not math.isnan(float(full.loss))

# ---------------------------------------------------------------- config keys of the algorithm section


def test_algorithm_defaults_are_valid_and_off():
    a = build_config().algorithm
    assert (a.advantage.name, a.advantage.params.eps, a.advantage.params.scale_rewards) == ("grpo", 1e-4, "group")
    assert (a.reward_combination, a.importance_sampling_level, a.kl_in) == ("sum_then_normalize", "token", "loss")
    assert a.policy_loss.params.ratio_c is None and a.entropy_coef == 0 and a.top_entropy_rho == 1.0
    assert not a.dynamic_sampling and a.max_sampling_tries == 3 and a.gfpo_filter.params.sample_size == 0
    assert a.gfpo_filter.name == "length" and not a.overlong_filter and a.overlong_cache_fraction == 0
    assert a.overlong_penalty_factor == 1.0 and a.ref_update_steps == 0 and a.ref_mix_alpha == 1.0


@pytest.mark.parametrize("key,value", [
    ("advantage.scale_rewards", "token"), ("advantage.eps", -1e-4), ("advantage", "gae"),
    ("reward_combination", "max"), ("importance_sampling_level", "segment"),
    ("policy_loss.ratio_c", 1.0), ("policy_loss.ratio_c", 0.5), ("entropy_coef", -0.1), ("top_entropy_rho", 0.0),
    ("top_entropy_rho", 1.5), ("kl_in", "advantage"), ("max_sampling_tries", -1), ("gfpo_filter.sample_size", 8),
    ("gfpo_filter.sample_size", 4), ("gfpo_filter", "reward"), ("overlong_cache_fraction", 1.0),
    ("overlong_cache_fraction", -0.1), ("overlong_penalty_factor", -1.0), ("ref_update_steps", -1),
    ("ref_mix_alpha", 0.0), ("ref_mix_alpha", 1.5),
])
def test_bad_algorithm_values_are_rejected_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        build_config(overrides={f"algorithm.{key}": value, "rollout.num_generations": 8})


@pytest.mark.parametrize("key,value", [
    ("advantage.scale_rewards", "batch"), ("advantage.scale_rewards", "none"), ("advantage.eps", 1e-6),
    ("advantage", "rloo"), ("reward_combination", "normalize_then_sum"),
    ("importance_sampling_level", "sequence"), ("policy_loss.ratio_c", 3.0), ("entropy_coef", 0.001),
    ("top_entropy_rho", 0.2), ("kl_in", "reward"), ("gfpo_filter.sample_size", 16), ("gfpo_filter", "token_efficiency"),
    ("overlong_cache_fraction", 0.2), ("ref_update_steps", 100), ("ref_mix_alpha", 0.5),
])
def test_good_algorithm_values_are_accepted(key, value):
    cfg = build_config(overrides={f"algorithm.{key}": value, "rollout.num_generations": 8})
    variant, _, param = key.partition(".")                    # policy_loss.ratio_c: a parameter of the entry
    got = getattr(cfg.algorithm, variant)
    assert (getattr(got.params, param) if param else got) == value


def test_logprob_gap_is_the_masked_mean_absolute_difference():
    from grpo.algorithms.loss import logprob_gap

    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    sampled = torch.tensor([[-1.5, -2.0, -9.0], [-0.25, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert logprob_gap(logp, sampled, mask) == pytest.approx((0.5 + 0.0 + 0.25 + 0.5) / 4)
    assert math.isnan(logprob_gap(logp, sampled, torch.zeros_like(mask)))


def test_clip_counts_split_into_high_and_low():
    """Ratios 1.5, 0.5, 1.1 with A = +1, -1, +1 (eps 0.2): token 0 clipped high (1.5 > 1.2, A > 0), token 1 clipped
    low (0.5 < 0.8, A < 0), token 2 inside the range: clipped_sum 2, of which high 1."""
    logp = torch.log(torch.tensor([[1.5], [0.5], [1.1]]))
    terms = grpo_loss(logp, torch.zeros(3, 1), None, torch.tensor([1.0, -1.0, 1.0]), torch.ones(3, 1), epsilon=0.2,
                      epsilon_high=None, beta=0.0, normalizer=3.0)
    assert (terms.clipped_sum, terms.clipped_high_sum, terms.tokens) == (2.0, 1.0, 3.0)
