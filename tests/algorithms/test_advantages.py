import pytest
import torch

from grpo.algorithms.advantages import (ADVANTAGE_ESTIMATORS, REWARD_COMBINERS, REWARD_SCALES, grpo_advantages,
                             normalize_then_sum)


def reference_group_advantages(rewards, G, eps):
    """Straight from DeepSeekMath eq. 3, in float64 with Python loops."""
    out = []
    for start in range(0, len(rewards), G):
        group = [float(r) for r in rewards[start:start + G]]
        mean = sum(group) / G
        std = (sum((r - mean) ** 2 for r in group) / (G - 1)) ** 0.5
        out += [0.0 if std == 0 else (r - mean) / (std + eps) for r in group]
    return torch.tensor(out, dtype=torch.float64)


def test_hand_derived_values():
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) = 0.57735; A = +-0.5 / 0.57735 = +-0.866025
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4, eps=0.0)
    assert torch.allclose(adv.values, torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-6)
    assert adv.zero_std_groups == 0 and adv.num_groups == 1


def test_matches_float64_reference():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(6 * 8, generator=g) * 3 - 1
    rewards[8:16] = 0.25                                   # one tied group
    got = grpo_advantages(rewards, 8, eps=1e-4)
    ref = reference_group_advantages(rewards.tolist(), 8, 1e-4)
    assert torch.allclose(got.values.double(), ref, atol=1e-6)
    assert got.zero_std_groups == 1 and got.num_groups == 6


def test_tied_groups_are_exactly_zero_never_nan():
    rewards = torch.tensor([0.1] * 3 + [1.0, 1.0, 1.0] + [0.0, 2.0, 4.0])
    adv = grpo_advantages(rewards, 3, eps=0.0)             # eps = 0 would divide 0/0 for tied groups
    assert torch.equal(adv.values[:6], torch.zeros(6))
    assert not torch.isnan(adv.values).any()
    assert adv.zero_std_groups == 2
    # group [0, 2, 4]: mean 2, std 2 -> [-1, 0, 1]
    assert torch.allclose(adv.values[6:], torch.tensor([-1.0, 0.0, 1.0]))


def test_advantages_sum_to_zero_per_group():
    rewards = torch.randn(40, generator=torch.Generator().manual_seed(1))
    adv = grpo_advantages(rewards, 8).values.view(5, 8)
    assert torch.allclose(adv.sum(dim=1), torch.zeros(5), atol=1e-5)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="groups of 3"):
        grpo_advantages(torch.zeros(7), 3)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        grpo_advantages(torch.zeros(4), 1)


def test_registry():
    assert ADVANTAGE_ESTIMATORS["grpo"] is grpo_advantages


def ref_rloo(rewards, G):
    out = []
    for s in range(0, len(rewards), G):
        g = [float(x) for x in rewards[s:s + G]]
        out += [0.0 if len(set(g)) == 1 else g[i] - sum(g[j] for j in range(G) if j != i) / (G - 1) for i in range(G)]
    return torch.tensor(out, dtype=torch.float64)


def ref_dr_grpo(rewards, G):
    out = []
    for s in range(0, len(rewards), G):
        g = [float(x) for x in rewards[s:s + G]]
        out += [0.0 if len(set(g)) == 1 else x - sum(g) / G for x in g]
    return torch.tensor(out, dtype=torch.float64)


def ref_reinforce_pp(rewards, G, eps):
    a = ref_dr_grpo(rewards, G).tolist()
    mean = sum(a) / len(a)
    std = (sum((x - mean) ** 2 for x in a) / (len(a) - 1)) ** 0.5
    return torch.tensor([(x - mean) / (std + eps) for x in a], dtype=torch.float64)


@pytest.mark.parametrize("name,ref", [
    ("dr_grpo", lambda r, G: ref_dr_grpo(r, G)),
    ("rloo", lambda r, G: ref_rloo(r, G)),
    ("reinforce_pp", lambda r, G: ref_reinforce_pp(r, G, 1e-4)),
])
def test_estimators_match_float64_references(name, ref):
    g = torch.Generator().manual_seed(2)
    rewards = torch.randint(0, 3, (5 * 4,), generator=g).float()
    rewards[:4] = 1.0                                          # a tied group
    got = ADVANTAGE_ESTIMATORS[name](rewards, 4, 1e-4)
    assert torch.allclose(got.values.double(), ref(rewards.tolist(), 4), atol=1e-5)
    assert got.zero_std_groups >= 1 and not torch.isnan(got.values).any()


def test_rloo_hand_values():
    # group [1, 0, 0, 0]: A_0 = 1 - 0 = 1; A_j = 0 - 1/3 = -1/3 (= G/(G-1) * (r - mean))
    got = ADVANTAGE_ESTIMATORS["rloo"](torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, 1e-4).values
    assert torch.allclose(got, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    # Dr. GRPO on the same group: r - 0.25
    got = ADVANTAGE_ESTIMATORS["dr_grpo"](torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, 1e-4).values
    assert torch.allclose(got, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_all_tied_batch_gives_zero_everywhere():
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        out = fn(torch.full((8,), 0.5), 4, 1e-4)
        assert torch.equal(out.values, torch.zeros(8)), name
        assert out.zero_std_groups == 2
        with pytest.raises(ValueError, match="group_size must be >= 2"):
            fn(torch.zeros(3), 1, 1e-4)


# ---------------------------------------------------------------- scale_rewards and missing rewards

NAN = float("nan")


def _finite(xs):
    return [x for x in xs if x == x]


def _std(xs):
    """Unbiased std of a list of floats (None when fewer than 2)."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def ref_grpo_scaled(rewards, G, eps, scale):
    """A_i = (r_i - mean of the group's finite rewards) / (std + eps); NaN rows and degenerate groups -> 0."""
    batch_std = _std(_finite(rewards)) or 0.0
    out = []
    for s in range(0, len(rewards), G):
        g = [float(x) for x in rewards[s:s + G]]
        fin = _finite(g)
        if len(fin) < 2 or len(set(fin)) == 1:
            out += [0.0] * G
            continue
        mean = sum(fin) / len(fin)
        div = {"group": _std(fin) + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        out += [0.0 if x != x else (x - mean) / div for x in g]
    return torch.tensor(out, dtype=torch.float64)


def nan_rewards(seed=3, B=6, G=4):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 4, (B * G,), generator=g).double() * 0.5 - 0.3
    r[1] = NAN                                   # one missing reward in a live group
    r[4:8] = torch.tensor([NAN, 0.7, NAN, NAN])  # a group with a single finite reward
    r[8:12] = NAN                                # a group with no reward at all
    r[12:16] = torch.tensor([0.2, NAN, 0.2, 0.2])  # tied finite rewards
    r[16:20] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # a clean group
    return r


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_scale_rewards_with_missing_rewards_matches_reference(scale):
    r = nan_rewards()
    got = ADVANTAGE_ESTIMATORS["grpo"](r, 4, 1e-4, scale_rewards=scale)
    assert torch.allclose(got.values, ref_grpo_scaled(r.tolist(), 4, 1e-4, scale), atol=1e-12)
    assert got.zero_std_groups == 3 and got.num_groups == 6
    assert not torch.isnan(got.values).any()
    assert torch.equal(got.values[torch.isnan(r)], torch.zeros(int(torch.isnan(r).sum()), dtype=r.dtype))


def test_scale_rewards_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.0])
    # group means 0.5 and 1; batch: mean 0.75, sum of squared deviations 0.125 + 2.8125 + 10.5625 = 13.5,
    # unbiased batch std sqrt(13.5 / 7) (the group means stay the baselines)
    got = grpo_advantages(r, 4, 0.0, scale_rewards="batch").values
    want = torch.tensor([0.5, -0.5, -0.5, 0.5, -1.0, -1.0, -1.0, 3.0]) / (13.5 / 7) ** 0.5
    assert torch.allclose(got, want, atol=1e-6)
    got = grpo_advantages(r, 4, 0.0, scale_rewards="none").values
    assert torch.allclose(got, torch.tensor([0.5, -0.5, -0.5, 0.5, -1.0, -1.0, -1.0, 3.0]))
    assert torch.equal(grpo_advantages(r, 4, 0.0, scale_rewards="none").values,
                       ADVANTAGE_ESTIMATORS["dr_grpo"](r, 4, 0.0).values)
    with pytest.raises(KeyError):
        grpo_advantages(r, 4, 0.0, scale_rewards="per-token")
    assert set(REWARD_SCALES) == {"group", "batch", "none"}


def test_batch_scale_with_eps_zero_and_all_tied_is_zero_not_nan():
    got = grpo_advantages(torch.tensor([0.3] * 4 + [NAN] * 4), 4, 0.0, scale_rewards="batch")
    assert torch.equal(got.values, torch.zeros(8)) and got.zero_std_groups == 2


@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "reinforce_pp"])
def test_other_estimators_ignore_scale_rewards(name):
    r = nan_rewards(seed=5)
    outs = [ADVANTAGE_ESTIMATORS[name](r, 4, 1e-4, scale_rewards=s).values for s in ("group", "batch", "none")]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def ref_rloo_nan(rewards, G):
    out = []
    for s in range(0, len(rewards), G):
        g = [float(x) for x in rewards[s:s + G]]
        fin = _finite(g)
        if len(fin) < 2 or len(set(fin)) == 1:
            out += [0.0] * G
            continue
        out += [0.0 if x != x else x - (sum(fin) - x) / (len(fin) - 1) for x in g]
    return torch.tensor(out, dtype=torch.float64)


def ref_reinforce_pp_nan(rewards, G, eps):
    a = ref_grpo_scaled(rewards, G, eps, "none").tolist()
    live = [x for x, r in zip(a, rewards) if r == r]
    mean, std = sum(live) / len(live), _std(live)
    return torch.tensor([0.0 if r != r else (x - mean) / (std + eps) for x, r in zip(a, rewards)], dtype=torch.float64)


@pytest.mark.parametrize("name,ref", [
    ("dr_grpo", lambda r: ref_grpo_scaled(r, 4, 1e-4, "none")),
    ("rloo", lambda r: ref_rloo_nan(r, 4)),
    ("reinforce_pp", lambda r: ref_reinforce_pp_nan(r, 4, 1e-4)),
])
def test_estimators_with_missing_rewards_match_references(name, ref):
    r = nan_rewards(seed=7)
    got = ADVANTAGE_ESTIMATORS[name](r, 4, 1e-4)
    assert torch.allclose(got.values, ref(r.tolist()), atol=1e-12)
    assert got.zero_std_groups == 3 and not torch.isnan(got.values).any()
    assert (got.values[torch.isnan(r)] == 0).all()


def test_every_estimator_all_missing_gives_zeros():
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        for scale in REWARD_SCALES:
            out = fn(torch.full((8,), NAN), 4, 0.0, scale_rewards=scale)
            assert torch.equal(out.values, torch.zeros(8)), name
            assert out.zero_std_groups == 2


def test_missing_reward_is_left_out_of_the_group_statistics():
    # [1, NaN, 0, 1] behaves like the group [1, 0, 1] (mean 2/3, std sqrt(1/3)), the NaN row is 0
    got = grpo_advantages(torch.tensor([1.0, NAN, 0.0, 1.0]), 4, 0.0).values
    m, sd = 2 / 3, (1 / 3) ** 0.5
    assert torch.allclose(got, torch.tensor([(1 - m) / sd, 0.0, -m / sd, (1 - m) / sd]), atol=1e-6)
    # the integer dtype path still works and returns floats
    assert grpo_advantages(torch.tensor([1, 0, 0, 1]), 4, 0.0).values.dtype == torch.float32

# ---------------------------------------------------------------- reward combination


def ref_sum(table, weights):
    out = []
    for row in table:
        pairs = [(w, x) for w, x in zip(weights, row) if x == x]
        out.append(sum(w * x for w, x in pairs) if pairs else NAN)
    return out


def ref_normalize_then_sum(table, weights, G, eps):
    N, R = len(table), len(weights)
    normed = [[NAN] * R for _ in range(N)]
    for k in range(R):
        for s in range(0, N, G):
            col = [table[i][k] for i in range(s, s + G)]
            fin = _finite(col)
            for i in range(s, s + G):
                x = table[i][k]
                if x != x:
                    continue
                if len(fin) < 2 or len(set(fin)) == 1:
                    normed[i][k] = 0.0
                else:
                    normed[i][k] = (x - sum(fin) / len(fin)) / (_std(fin) + eps)
    return ref_sum(normed, weights)


def reward_table(seed=11, N=12, R=3):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, 5, (N, R), generator=g).double() * 0.25
    t[0, 1] = NAN
    t[3] = NAN                                    # a row no reward function applied to
    t[4:8, 2] = 0.5                               # a tied column within group 2
    t[8:12, 0] = torch.tensor([NAN, NAN, NAN, 2.0])  # a single finite entry in the column of group 3
    return t


def assert_same_with_nan(got, want):
    want = torch.tensor(want, dtype=torch.float64)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.allclose(got[~torch.isnan(got)], want[~torch.isnan(want)], atol=1e-12)


def test_sum_then_normalize_matches_reference():
    t, w = reward_table(), torch.tensor([1.0, 0.5, -2.0], dtype=torch.float64)
    got = REWARD_COMBINERS["sum_then_normalize"](t, w, 4, 1e-4)
    assert_same_with_nan(got, ref_sum(t.tolist(), w.tolist()))
    assert torch.isnan(got[3]) and not torch.isnan(got[torch.arange(12) != 3]).any()


def test_normalize_then_sum_matches_reference():
    t, w = reward_table(), torch.tensor([1.0, 0.5, -2.0], dtype=torch.float64)
    got = REWARD_COMBINERS["normalize_then_sum"](t, w, 4, 1e-4)
    assert_same_with_nan(got, ref_normalize_then_sum(t.tolist(), w.tolist(), 4, 1e-4))
    assert torch.isnan(got[3])


def test_normalize_then_sum_hand_values_and_gdpo_pipeline():
    # correctness in {0, 1} and format in {0, 10}: after per-function normalisation both count equally
    t = torch.tensor([[1.0, 0.0], [0.0, 10.0], [0.0, 0.0], [1.0, 10.0]])
    got = normalize_then_sum(t, torch.tensor([1.0, 1.0]), 4, 0.0)
    z = 0.5 / (1 / 3) ** 0.5                       # (1 - 0.5) / std([1, 0, 0, 1])
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -2 * z, 2 * z]), atol=1e-5)
    # a tied column contributes 0, not NaN
    tied = torch.tensor([[1.0, 3.0], [0.0, 3.0], [0.0, 3.0], [1.0, 3.0]])
    assert torch.allclose(normalize_then_sum(tied, torch.tensor([1.0, 1.0]), 4, 0.0),
                          torch.tensor([z, -z, -z, z]), atol=1e-5)
    # GDPO: per-function group normalisation, then grpo with batch normalisation of the total
    total = REWARD_COMBINERS["normalize_then_sum"](t, torch.tensor([1.0, 1.0]), 2, 1e-4)
    adv = ADVANTAGE_ESTIMATORS["grpo"](total, 2, 1e-4, scale_rewards="batch")
    assert torch.allclose(adv.values.double(), ref_grpo_scaled(total.tolist(), 2, 1e-4, "batch"), atol=1e-6)
    with pytest.raises(ValueError, match="groups of 3"):
        normalize_then_sum(t, torch.tensor([1.0, 1.0]), 3, 0.0)

