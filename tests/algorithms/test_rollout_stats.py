"""grpo/algorithms/rollout_stats.py: repetition flags against hand-counted n-grams, Pearson's r against numpy."""

import numpy as np
import pytest
import torch

from grpo.algorithms.rollout_stats import pearson, repeated_ngram_rows


def test_repeated_ngrams_counted_by_hand():
    loop = [1, 2, 3, 4] * 8 + [9]                  # (1, 2, 3, 4) occurs 8 times
    short = [1, 2, 3, 4] * 7 + [9] * 5             # 7 times: below the threshold
    runs = [5] * 11                                # (5, 5, 5, 5) overlapping: 11 - 4 + 1 = 8 times
    width = max(map(len, (loop, short, runs)))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in (loop, short, runs)])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in (loop, short, runs)])
    assert repeated_ngram_rows(ids, mask).tolist() == [True, False, True]
    mask[2, 10] = 0                                # one token fewer: 7 overlapping occurrences
    assert repeated_ngram_rows(ids, mask).tolist() == [True, False, False]
    assert repeated_ngram_rows(ids, mask, n=4, min_count=7).tolist() == [True, True, True]
    with pytest.raises(ValueError, match="min_count >= 2"):
        repeated_ngram_rows(ids, mask, min_count=1)


def test_pearson_matches_numpy_and_is_nan_when_undefined():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    y = 0.6 * x + y
    assert pearson(torch.tensor(x), torch.tensor(y)) == pytest.approx(float(np.corrcoef(x, y)[0, 1]), abs=1e-12)
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 6.0])) == pytest.approx(1.0)
    assert np.isnan(pearson(torch.ones(4), torch.arange(4.0)))                      # constant lengths
    assert pearson(torch.tensor([1.0, 2.0, float("nan"), 3.0]), torch.tensor([1.0, 2.0, 5.0, 3.0])) == pytest.approx(1.0)
