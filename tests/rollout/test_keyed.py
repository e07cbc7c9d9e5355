"""Counter-based sampling randomness (grpo/rollout/keyed.py): values, purity, independence of the batch."""

import torch

from grpo.rollout.keyed import as_int64, mix64, row_keys, token_uniforms

MASK = (1 << 64) - 1


def mix_ref(z: int) -> int:
    """SplitMix64's finalizer on unsigned Python ints (the published reference, mod 2**64 by hand)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def child_ref(parent: int, index: int) -> int:
    return mix_ref((parent + (index + 1) * 0x9E3779B97F4A7C15) & MASK)


def uniform_ref(seed: int, p: int, g: int, t: int) -> float:
    key = child_ref(child_ref(mix_ref(seed & MASK), p), g)
    return (child_ref(key, t) >> 11) / 2 ** 53


def test_mix64_is_splitmix64():
    # SplitMix64 seeded with 0: its first outputs are mix(GAMMA), mix(2 GAMMA), ... (the published sequence)
    state = torch.tensor([as_int64(k * 0x9E3779B97F4A7C15) for k in (1, 2, 3)], dtype=torch.long)
    out = [v & MASK for v in mix64(state).tolist()]
    assert out == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    x = torch.tensor([0, 1, -1, as_int64(1 << 63), 123456789, -987654321], dtype=torch.long)
    assert [v & MASK for v in mix64(x).tolist()] == [mix_ref(v & MASK) for v in x.tolist()]


def test_uniforms_equal_the_pure_python_reference():
    for seed in (0, 7, -3, 2 ** 70 + 5):
        index = torch.tensor([0, 5, 2 ** 40], dtype=torch.long)
        keys = row_keys(seed, index, 3)                                          # [9]
        for t in (0, 1, 1000):
            u = token_uniforms(keys, t)
            expected = [uniform_ref(seed, p, g, t) for p in index.tolist() for g in range(3)]
            assert u.dtype == torch.float64 and u.tolist() == expected
            assert ((u >= 0) & (u < 1)).all()


def test_a_rows_uniforms_do_not_depend_on_the_other_rows():
    keys = row_keys(3, torch.tensor([10, 11, 12, 13]), 4)                       # [16]
    subset = torch.tensor([14, 2, 7])                                           # any rows, any order
    alone = row_keys(3, torch.tensor([13, 10, 11]), 4)[torch.tensor([2, 6, 11])]  # the same (p, g) elsewhere
    assert torch.equal(alone, keys[subset])
    for t in range(5):
        # rows that stopped (dropped from the batch) do not shift the draws of the rows still running
        assert torch.equal(token_uniforms(keys[subset], t), token_uniforms(keys, t)[subset])


def test_a_block_of_steps_equals_the_steps_one_at_a_time():
    keys = row_keys(9, torch.tensor([3, 1]), 2)                                 # [4]
    block = token_uniforms(keys[:, None], torch.arange(30, 62))                 # [4, 32]: steps 30..61 at once
    assert torch.equal(block, torch.stack([token_uniforms(keys, t) for t in range(30, 62)], dim=1))


def test_keys_separate_seed_prompt_sample_and_token():
    u = {}
    for seed in (0, 1):
        for p in (0, 1, 2):
            keys = row_keys(seed, torch.tensor([p]), 3)
            for t in range(3):
                for g, v in enumerate(token_uniforms(keys, t).tolist()):
                    u[(seed, p, g, t)] = v
    assert len(set(u.values())) == len(u) == 54                                  # no two keys share a uniform


def test_uniforms_are_uniform():
    u = token_uniforms(row_keys(0, torch.arange(20_000), 2), 3)                 # 40k draws
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / u.numel()
    assert torch.allclose(hist, torch.full((10,), 0.1), atol=0.006)             # 4 sigma of 0.0015
    assert abs(float(u.mean()) - 0.5) < 0.006
    # consecutive tokens of one row are uncorrelated
    keys = row_keys(1, torch.arange(10_000), 1)
    a, b = token_uniforms(keys, 0), token_uniforms(keys, 1)
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.04
