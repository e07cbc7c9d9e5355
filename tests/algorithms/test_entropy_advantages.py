"""EDGE-GRPO (arXiv 2507.21848), GTPO and GRPO-S (arXiv 2508.04349): hand values, float64 loops,
reductions to GRPO."""

import functools
import math

import torch

from grpo.algorithms.advantages import grpo_advantages
from grpo.algorithms.entropy_advantages import (ENTROPY_ADVANTAGES, edge_advantages, grpo_s_advantages,
                                                grpo_s_rewards, gtpo_advantages, gtpo_token_rewards,
                                                guided_correction_rows, mean_entropy, outcome_ties)

CPU = torch.device("cpu")
f64 = lambda *v: torch.tensor(v, dtype=torch.float64, device=CPU)  # noqa: E731
estimate = lambda G: (lambda r: grpo_advantages(r, G).values)       # noqa: E731


def test_mean_entropy_is_masked():
    H = f64(1.0, 3.0, 9.0, 2.0, 2.0, 2.0).view(2, 3)
    mask = f64(1, 1, 0, 1, 1, 1).view(2, 3)
    assert torch.equal(mean_entropy(H, mask), f64(2.0, 2.0))


def test_edge_hand_values():
    # mean entropies 1, 2, 3, 2 -> batch mean 2; A^_i = A_i * 2 / H_i
    H = f64(1, 1, 2, 2, 3, 3, 2, 2).view(4, 2)
    mask = torch.ones(4, 2, dtype=torch.float64)
    adv = f64(1.0, -1.0, 0.5, -0.5)
    got = edge_advantages(None, adv, None, H, mask, 2, 0.0, None)
    assert torch.allclose(got, f64(2.0, -1.0, 1.0 / 3, -0.5), rtol=1e-12)


def test_edge_reduces_to_grpo_with_equal_entropies():
    adv = grpo_advantages(f64(1, 0, 0, 1, 1, 0), 3).values
    H = torch.full((6, 4), 0.7, dtype=torch.float64)
    mask = (torch.arange(4)[None, :] < torch.tensor([4, 1, 2, 3, 4, 2])[:, None]).double()
    assert torch.allclose(edge_advantages(None, adv, None, H, mask, 3, 0.0, None), adv, rtol=1e-12)


def test_grpo_s_rewards_hand_values():
    # one group: correct rows 0, 1 with mean entropies 1 and 3 (n = 2); wrong rows 2, 3 with 1 and 4 (m = 2)
    r = f64(1, 1, 0, 0)
    correct = r > 0
    H = f64(1, 1, 3, 3, 1, 1, 4, 4).view(4, 2)
    mask = torch.ones(4, 2, dtype=torch.float64)
    w = 0.2
    got = grpo_s_rewards(r, correct, H, mask, 4, w)
    inv = 1 / 1 + 1 / 4
    expected = f64(1 + w * 2 * 1 / 4, 1 + w * 2 * 3 / 4, -w * 2 * 1 / inv, -w * 2 * 0.25 / inv)
    assert torch.allclose(got, expected, rtol=1e-12)
    # the entropy term averages to +w over the correct ones and -w over the wrong ones
    assert math.isclose(float(got[:2].mean()), 1 + w) and math.isclose(float(got[2:].mean()), -w)


def test_grpo_s_reduces_to_grpo_at_weight_zero():
    r = f64(1, 0, 0, 1, 1, 1, 0, 0)
    H = torch.rand(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(8, 5, dtype=torch.float64)
    got = ENTROPY_ADVANTAGES["grpo_s"](r, None, r > 0, H, mask, 4, 0.0, estimate(4))
    assert torch.equal(got, grpo_advantages(r, 4).values)


def reference_gtpo_rewards(r, correct, H, lengths, G, w):
    """Float64 loops: per group and position, entropy shares among the correct (wrong) rows present."""
    N, T = len(r), len(H[0])
    out = [[0.0] * T for _ in range(N)]
    for b in range(N // G):
        rows = range(b * G, b * G + G)
        for t in range(T):
            pos = [i for i in rows if correct[i] and t < lengths[i]]
            neg = [i for i in rows if not correct[i] and t < lengths[i]]
            for i in pos:
                out[i][t] = r[i] + w * len(pos) * H[i][t] / sum(H[k][t] for k in pos)
            for j in neg:
                out[j][t] = r[j] - w * len(neg) * (1 / H[j][t]) / sum(1 / H[k][t] for k in neg)
    return out


def test_gtpo_matches_the_paper_example():
    """Eq. 3 and 5 with alpha_1 = 1, alpha_2 = 0.1, hand-computed: two correct completions with entropies
    [3, 1] and [1, 3] (t = 0: shares 3/4 and 1/4 of d_0 = 2), two wrong ones with [4, 1] and [1, 4] and
    reward -1 (inverse entropies 1/4 and 1 at t = 0, sum 1.25, h_0 = 2)."""
    r = f64(1, 1, -1, -1)
    H = f64(3, 1, 1, 3, 4, 1, 1, 4).view(4, 2)
    got = gtpo_token_rewards(r, r > 0, H, torch.ones(4, 2, dtype=torch.float64), 4, 0.1)
    expected = f64(1.15, 1.05, 1.05, 1.15, -1.04, -1.16, -1.16, -1.04).view(4, 2)
    assert torch.allclose(got, expected, rtol=1e-12)


def test_gtpo_token_rewards_match_float64_loops():
    g = torch.Generator().manual_seed(1)
    r = f64(1, 0, 1, 0, 0, 1, 1, 1)
    H = torch.rand(8, 5, dtype=torch.float64, generator=g) + 0.05
    lengths = [5, 3, 1, 5, 2, 4, 5, 5]
    mask = (torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]).double()
    got = gtpo_token_rewards(r, r > 0, H, mask, 4, 0.3)
    ref = torch.tensor(reference_gtpo_rewards(r.tolist(), (r > 0).tolist(), H.tolist(), lengths, 4, 0.3),
                       dtype=torch.float64)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-15)


def test_gtpo_hand_value_and_reduction():
    # one correct row alone at a position: its share is H / H * 1 = 1, so r~ = r + w
    r = f64(1, 0)
    H = f64(0.5, 2.0).view(2, 1)
    got = gtpo_token_rewards(r, r > 0, H, torch.ones(2, 1, dtype=torch.float64), 2, 0.25)
    assert torch.allclose(got, f64(1.25, -0.25).view(2, 1))
    # weight 0: every token gets exactly GRPO's advantage
    r = f64(1, 0, 0, 1, 1, 1)
    H = torch.rand(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(4)[None, :] < torch.tensor([4, 1, 2, 3, 4, 2])[:, None]).double()
    got = gtpo_advantages(r, None, r > 0, H, mask, 3, 0.0, None)
    expected = grpo_advantages(r, 3).values.unsqueeze(1) * mask
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-15)


def test_gtpo_advantages_normalise_by_the_group_of_mean_shaped_rewards():
    r = f64(1, 0, 1, 0)
    H = f64(1, 3, 2, 2, 1, 1, 2, 2).view(4, 2)
    mask = torch.ones(4, 2, dtype=torch.float64)
    tok = gtpo_token_rewards(r, r > 0, H, mask, 4, 0.5)
    R = tok.mean(1)
    expected = (tok - R.mean()) / (R.std() + 1e-4)
    assert torch.allclose(gtpo_advantages(r, None, r > 0, H, mask, 4, 0.5, None), expected, rtol=1e-12)


def test_a_group_whose_rewards_tie_gets_no_advantage_from_the_entropy_term():
    """Group 0 all correct, group 1 all wrong (no signal: GRPO gives 0), group 2 mixed. The entropies
    differ within every group, so the shaped rewards differ; only group 2 may get advantages, and they
    are what the group gets alone (the normalisation is per group)."""
    r = f64(1, 1, 1, 0, 0, 0, 1, 0, 0)
    H = f64(0.1, 0.2, 1.0, 2.0, 0.5, 0.5, 0.3, 0.9, 1.5, 0.1, 0.4, 0.4, 2.0, 0.2, 0.7, 0.7, 0.05, 1.0).view(9, 2)
    mask = torch.ones(9, 2, dtype=torch.float64)
    assert outcome_ties(r, 3).tolist() == [True] * 6 + [False] * 3
    assert outcome_ties(f64(1, 1, float("nan"), 0), 2).tolist() == [True, True, True, True]   # one finite: no signal
    for fn, w in ((gtpo_advantages, 0.1), (grpo_s_advantages, 0.1), (gtpo_advantages, 2.0)):
        got = fn(r, None, r > 0, H, mask, 3, w, estimate(3))
        assert torch.equal(got[:6], torch.zeros_like(got[:6])), fn.__name__
        alone = fn(r[6:], None, r[6:] > 0, H[6:], mask[6:], 3, w, estimate(3))
        assert torch.allclose(got[6:], alone, rtol=1e-12) and bool((got[6:] != 0).any())
    # hand value, GRPO-S in the mixed group (mean entropies 1.1, 0.7, 0.525; row 6 the only correct one):
    # r^ = (1 + w, -w * 2 * (1/0.7) / (1/0.7 + 1/0.525), -w * 2 * (1/0.525) / (1/0.7 + 1/0.525))
    w = 0.1
    inv = 1 / 0.7 + 1 / 0.525
    shaped = f64(1 + w, -w * 2 * (1 / 0.7) / inv, -w * 2 * (1 / 0.525) / inv)
    expected = (shaped - shaped.mean()) / (shaped.std() + 1e-4)
    got = grpo_s_advantages(r, None, r > 0, H, mask, 3, w, lambda x: grpo_advantages(x, 3, 1e-4).values)
    assert torch.allclose(got[6:], expected, rtol=1e-10)


def test_guided_correction_rows():
    correct = torch.tensor([False, False, False, True, False, False, False, False, False], device=CPU)
    rewarded = torch.tensor([True] * 6 + [False] * 3, device=CPU)
    has = torch.tensor([True, True, True], device=CPU)
    # group 0: all wrong -> its last row 2; group 1 has a correct answer; group 2 has no reward at all
    assert guided_correction_rows(correct, rewarded, has, 3).tolist() == [2]
    assert guided_correction_rows(correct, rewarded, torch.tensor([False, True, True]), 3).tolist() == []


def test_registry():
    assert ENTROPY_ADVANTAGES["none"] is None
    assert ENTROPY_ADVANTAGES["edge"] is edge_advantages
    assert isinstance(ENTROPY_ADVANTAGES["grpo_s"], (type(edge_advantages), functools.partial))
