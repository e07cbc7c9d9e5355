import pytest
import torch

from grpo.advantages import ADVANTAGE_ESTIMATORS, grpo_advantages


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
