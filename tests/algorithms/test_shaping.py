import math

import pytest
import torch

from grpo.algorithms.advantages import ADVANTAGE_ESTIMATORS
from grpo.algorithms.shaping import (GFPO_METRICS, gfpo_select, informative_groups, kl_in_reward, overlong_keep,
                          process_advantages, soft_overlong_penalty, token_step_ids, top_entropy_mask)

NAN = float("nan")

# ---------------------------------------------------------------- dynamic sampling


def test_informative_groups_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0,        # mixed -> kept
                      0.5, 0.5, 0.5,        # tied -> dropped
                      NAN, 1.0, NAN,        # a single finite reward -> dropped
                      NAN, NAN, NAN,        # no reward -> dropped
                      1.0, NAN, 1.0,        # tied finite rewards -> dropped
                      NAN, 2.0, 1.0])       # two different finite rewards -> kept
    assert informative_groups(r, 3).tolist() == [True, False, False, False, False, True]


def test_informative_groups_agree_with_the_zero_std_count():
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (40,), generator=g).float()
    r[torch.rand(40, generator=g) < 0.2] = NAN
    keep = informative_groups(r, 4)
    adv = ADVANTAGE_ESTIMATORS["grpo"](r, 4, 1e-4)
    assert int((~keep).sum()) == adv.zero_std_groups
    assert (adv.values.view(10, 4)[~keep] == 0).all()
    with pytest.raises(ValueError, match="groups of 3"):
        informative_groups(torch.zeros(4), 3)

# ---------------------------------------------------------------- GFPO


def ref_gfpo(rewards, lengths, k, G, metric):
    """For each group, the G best rows by the metric (ties -> lower index), in original order."""
    out = []
    for s in range(0, len(rewards), k):
        def key(i):
            if metric == "length":
                return (lengths[i], i)
            eff = rewards[i] / max(lengths[i], 1)
            return (-eff if eff == eff else math.inf, i)
        out += sorted(sorted(range(s, s + k), key=key)[:G])
    return out


@pytest.mark.parametrize("metric", sorted(GFPO_METRICS))
def test_gfpo_select_matches_reference(metric):
    g = torch.Generator().manual_seed(1)
    B, k, G = 5, 8, 3
    rewards = torch.randint(0, 3, (B * k,), generator=g).float()
    rewards[3] = NAN
    lengths = torch.randint(1, 6, (B * k,), generator=g)       # many ties
    got = gfpo_select(rewards, lengths, k, G, metric)
    assert got.dtype == torch.long and got.shape == (B * G,)
    assert got.tolist() == ref_gfpo(rewards.tolist(), lengths.tolist(), k, G, metric)


def test_gfpo_select_hand_values():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    lengths = torch.tensor([9, 2, 4, 2, 7, 3])
    # shortest two of each group of 3, original order kept: [1, 2] and [3, 5]
    assert gfpo_select(rewards, lengths, 3, 2, "length").tolist() == [1, 2, 3, 5]
    # reward per token: group 1 [1/9, 0, 1/4] -> rows 0, 2; group 2 [1/2, 0, 1/3] -> rows 3, 5
    assert gfpo_select(rewards, lengths, 3, 2, "token_efficiency").tolist() == [0, 2, 3, 5]
    # all tied: the first G rows of each group
    assert gfpo_select(torch.zeros(6), torch.ones(6), 3, 2, "length").tolist() == [0, 1, 3, 4]
    with pytest.raises(ValueError, match="G <= k"):
        gfpo_select(rewards, lengths, 3, 4)
    with pytest.raises(KeyError):
        gfpo_select(rewards, lengths, 3, 2, "reward")

# ---------------------------------------------------------------- overlong handling


def test_overlong_keep():
    assert torch.equal(overlong_keep(torch.tensor([True, False, False, True])), torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert overlong_keep(torch.zeros(0, dtype=torch.bool)).shape == (0,)


def ref_soft_overlong(length, L_max, L_cache):
    """DAPO eq. 13."""
    if length <= L_max - L_cache:
        return 0.0
    if length <= L_max:
        return ((L_max - L_cache) - length) / L_cache
    return -1.0


def test_soft_overlong_penalty_matches_eq_13():
    lengths = torch.arange(0, 25)
    got = soft_overlong_penalty(lengths, 20, 5, factor=0.5)
    want = torch.tensor([0.5 * ref_soft_overlong(y, 20, 5) for y in range(25)])
    assert torch.allclose(got, want) and got.dtype == torch.float32
    # hand values: 15 is the last free length, 20 the last in the ramp
    assert soft_overlong_penalty(torch.tensor([15, 16, 20, 21]), 20, 5).tolist() == pytest.approx([0, -0.2, -1, -1])
    assert torch.equal(soft_overlong_penalty(lengths, 20, 0), torch.zeros(25))
    with pytest.raises(ValueError, match="cache"):
        soft_overlong_penalty(lengths, 20, 21)

# ---------------------------------------------------------------- KL in the reward


def test_kl_in_reward_matches_reference():
    g = torch.Generator().manual_seed(2)
    rewards = torch.tensor([1.0, NAN, 0.5, -2.0], dtype=torch.float64)
    kl = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 3, 0, 2])[:, None]).double()
    kl[3, 5] = math.inf                                   # garbage at padding is ignored
    got = kl_in_reward(rewards, kl, mask, 0.1)
    K, M = kl.tolist(), mask.tolist()
    want = [r - 0.1 * sum(K[i][t] for t in range(6) if M[i][t]) for i, r in enumerate(rewards.tolist())]
    assert torch.isnan(got[1]) and not torch.isnan(got[[0, 2, 3]]).any()
    assert torch.allclose(got[[0, 2, 3]], torch.tensor(want, dtype=torch.float64)[[0, 2, 3]], atol=1e-12)
    assert float(got[2]) == 0.5                            # empty completion: no penalty

# ---------------------------------------------------------------- top-rho entropy tokens


def ref_top_entropy(entropy, mask, rho):
    active = [(i, t) for i in range(len(mask)) for t in range(len(mask[0])) if mask[i][t]]
    keep = math.ceil(round(rho * len(active), 9))
    chosen = sorted(active, key=lambda it: (-entropy[it[0]][it[1]], it))[:keep]
    return [[1.0 if (i, t) in chosen else 0.0 for t in range(len(mask[0]))] for i in range(len(mask))]


@pytest.mark.parametrize("rho", [0.2, 0.5, 0.7, 1.0, 1e-6])
def test_top_entropy_mask_matches_reference(rho):
    g = torch.Generator().manual_seed(3)
    entropy = torch.randint(0, 4, (5, 6), generator=g).float() / 3     # many ties
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 0, 5, 1])[:, None]).float()
    got = top_entropy_mask(entropy, mask, rho)
    assert got.tolist() == ref_top_entropy(entropy.tolist(), mask.tolist(), rho)
    assert float(got.sum()) == math.ceil(round(rho * 14, 9)) and (got <= mask).all()


def test_top_entropy_mask_edge_cases():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.9, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])      # the highest entropy is at padding
    # ceil(0.5 * 4) = 2 -> the two 0.9 tokens; ceil(0.25 * 4) = 1 -> the tie goes to the earlier 0.9
    assert top_entropy_mask(entropy, mask, 0.5).tolist() == [[0, 1, 0, 1, 0]]
    assert top_entropy_mask(entropy, mask, 0.25).tolist() == [[0, 1, 0, 0, 0]]
    assert torch.equal(top_entropy_mask(entropy, mask, 1.0), mask)
    assert torch.equal(top_entropy_mask(entropy, torch.zeros(1, 5), 0.2), torch.zeros(1, 5))
    assert float(top_entropy_mask(torch.rand(4, 25), torch.ones(4, 25), 0.55).sum()) == 55  # 0.55 * 100 = 55.00000000000001
    for rho in (0.0, 1.1):
        with pytest.raises(ValueError, match="rho"):
            top_entropy_mask(entropy, mask, rho)

# ---------------------------------------------------------------- process supervision


def test_token_step_ids_hand_values():
    texts = [["Step", " one", ".\n", "Two", "\n", "end"],
             ["a\nb", "c", "\n"],                       # a token containing the delimiter closes its step
             [],                                         # an empty completion
             ["x", "\n", "\n"]]                          # an empty step of its own
    got = token_step_ids(texts, "\n")
    assert got.tolist() == [[0, 0, 0, 1, 1, 2],
                            [0, 1, 1, -1, -1, -1],
                            [-1] * 6,
                            [0, 0, 1, -1, -1, -1]]
    assert token_step_ids(texts, "\n", width=8).shape == (4, 8)
    with pytest.raises(ValueError, match="more than width"):
        token_step_ids(texts, "\n", width=3)
    # a token holding two delimiters closes two steps (the second owns no token), as str.split
    assert token_step_ids([["a", "\n\n", "b"]], "\n").tolist() == [[0, 0, 2]]
    with pytest.raises(ValueError, match="non-empty"):
        token_step_ids(texts, "")


def test_token_step_ids_multi_character_delimiter_split_over_tokens():
    got = token_step_ids([["ab", "\n", "\ncd", "e", "\n\n", "f"]], "\n\n")
    assert got.tolist() == [[0, 0, 0, 1, 1, 2]]


@pytest.mark.parametrize("delimiter", ["\n", "\n\n", "ab"])
def test_token_step_ids_agree_with_str_split_for_random_tokenisations(delimiter):
    g = torch.Generator().manual_seed(len(delimiter))
    alphabet = ["a", "b", "\n", "x"]
    for _ in range(50):
        text = "".join(alphabet[int(j)] for j in torch.randint(0, 4, (30,), generator=g))
        cuts = sorted(set(torch.randint(1, 30, (8,), generator=g).tolist()))
        tokens = [text[a:b] for a, b in zip([0] + cuts, cuts + [30])]
        starts = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
        want = [text[:s].count(delimiter) for s in starts]   # delimiters that end before the token starts
        assert token_step_ids([tokens], delimiter).tolist() == [want]
        steps = text.split(delimiter)
        assert max(want) <= len(steps) - 1


def ref_process_advantages(step_rewards, step_ids, G, eps):
    """DeepSeekMath 4.1.3 in float64 loops: normalise over all step rewards of the group, then each
    token gets the sum of the normalised rewards of its step and all later steps."""
    N, T = len(step_ids), len(step_ids[0])
    out = [[0.0] * T for _ in range(N)]
    for s in range(0, N, G):
        pool = [x for i in range(s, s + G) for x in step_rewards[i] if x == x]
        if len(pool) < 2 or len(set(pool)) == 1:
            continue
        mean = sum(pool) / len(pool)
        std = (sum((x - mean) ** 2 for x in pool) / (len(pool) - 1)) ** 0.5
        for i in range(s, s + G):
            normed = [0.0 if x != x else (x - mean) / (std + eps) for x in step_rewards[i]]
            for t in range(T):
                j = step_ids[i][t]
                if j >= 0:
                    out[i][t] = sum(normed[j:])
    return torch.tensor(out, dtype=torch.float64)


def test_process_advantages_match_reference():
    texts = [["a", "\n", "b", "\n", "c"], ["d", "e\n", "f"], ["g\n"], [],
             ["h", "\n", "i", "\n", "j", "\n"], ["k\n", "l"], ["m", "\n"], ["n", "o", "p"]]
    ids = token_step_ids(texts, "\n")
    step_rewards = [[1.0, 0.0, 0.5], [0.2, 0.9], [1.0], [],            # group 1
                    [0.0, NAN, 1.0], [0.3], [0.7], [0.1]]              # group 2: a NaN step; row 5 step 1 unrewarded
    got = process_advantages(step_rewards, ids, 4, 1e-4)
    assert got.dtype == torch.float32 and got.shape == ids.shape
    assert torch.allclose(got.double(), ref_process_advantages(step_rewards, ids.tolist(), 4, 1e-4), atol=1e-6)
    assert (got[ids < 0] == 0).all() and (got[3] == 0).all()
    assert (got[5, 1:] == 0).all() and got[5, 0] != 0                  # past the last rewarded step: 0


def test_process_advantages_hand_values():
    # group of 2: rewards [[1, 0], [1]] -> pool [1, 0, 1], mean 2/3, std sqrt(1/3)
    ids = torch.tensor([[0, 0, 1, -1], [0, 0, 0, 0]])
    got = process_advantages([[1.0, 0.0], [1.0]], ids, 2, 0.0)
    m, sd = 2 / 3, (1 / 3) ** 0.5
    hi, lo = (1 - m) / sd, (0 - m) / sd
    assert torch.allclose(got, torch.tensor([[hi + lo, hi + lo, lo, 0.0], [hi] * 4]), atol=1e-6)


def test_process_advantages_degenerate_groups_are_zero():
    ids = torch.tensor([[0, 1, -1], [0, 0, 0], [0, -1, -1], [0, 1, 2]])
    # group 1 has a single step reward overall (std undefined); group 2 has tied step rewards
    got = process_advantages([[0.7], [], [0.4], [0.4, 0.4, 0.4]], ids, 2, 0.0)
    assert torch.equal(got, torch.zeros(4, 3))
    assert torch.equal(process_advantages([[], []], ids[:2], 2, 1e-4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        process_advantages([[1.0], [1.0]], ids[:2], 1, 1e-4)
    with pytest.raises(ValueError, match="reward lists"):
        process_advantages([[1.0]], ids[:2], 2, 1e-4)


def test_each_shaping_has_one_implementation_and_one_way():
    """Dr. GRPO: the dr_grpo estimator is grpo with scale_rewards=none (same values); dr_grpo takes no
    scale_rewards parameter. Soft overlong: the reward and algorithm.overlong_cache_fraction give the same penalty,
    and configuring both is a one-line error naming both keys."""
    from grpo.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from grpo.config import ConfigError, build_config
    from grpo.rewards.shaping import make_soft_overlong

    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 0.0, 1.0, 1.0])
    for scale in ("group", "none"):
        assert torch.equal(ADVANTAGE_ESTIMATORS["dr_grpo"](r, 4, 1e-4, scale).values,
                           ADVANTAGE_ESTIMATORS["grpo"](r, 4, 1e-4, "none").values)
    with pytest.raises(ConfigError, match="'algorithm.advantage.scale_rewards': algorithm.advantage dr_grpo takes eps"):
        build_config(overrides={"algorithm.advantage": {"name": "dr_grpo", "scale_rewards": "batch"}})
    lengths = torch.tensor([10.0, 85.0, 95.0, 100.0])
    as_reward = make_soft_overlong(max_len=100, cache=20)(["p"] * 4, ["x"] * 4, completion_ids=[[1] * int(n) for n in lengths])
    assert as_reward == soft_overlong_penalty(lengths, 100, 20, 1.0).tolist() == pytest.approx([0.0, -0.25, -0.75, -1.0])
    with pytest.raises(ConfigError, match="soft overlong punishment given twice: reward.functions has soft_overlong "
                                          "and algorithm.overlong_cache_fraction > 0"):
        build_config(overrides={"reward.functions": ["accuracy", "soft_overlong:max_len=100"],
                                "algorithm.overlong_cache_fraction": 0.2})
