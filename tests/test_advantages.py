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
