"""Per-step statistics of the sampled completions that the health rules read (grpo/health/).

* **Repetition**: a completion is *repetitive* when one of its token n-grams occurs at least `min_count`
  times (n = 4, 8 times by default: a loop like "1+1=2,1+1=2,..." that sampling fell into).
* **Length/reward correlation**: Pearson's r between completion lengths and total rewards of one
  step; near 1 when the reward pays for length itself (a length hack), near 0 when it does not care.
"""

from __future__ import annotations

from collections import Counter

import torch


def repeated_ngram_rows(ids: torch.Tensor, mask: torch.Tensor, n: int = 4, min_count: int = 8) -> torch.Tensor:
    """Which completions hold an n-gram of tokens repeated at least `min_count` times (overlapping
    occurrences count: "aaaaa" holds the 2-gram "aa" 4 times). Only tokens where `mask` is set count.

    Shape:
        ids, mask: [N, T]  ->  [N] bool, on `ids`' device
    """
    if n < 1 or min_count < 2:
        raise ValueError(f"repeated_ngram_rows needs n >= 1 and min_count >= 2, got n={n}, min_count={min_count}")
    flags = []
    for row, keep in zip(ids.tolist(), mask.tolist()):
        tokens = [t for t, m in zip(row, keep) if m]
        grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
        flags.append(bool(grams) and max(grams.values()) >= min_count)
    return torch.tensor(flags, dtype=torch.bool, device=ids.device)


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson's correlation r = cov(x, y) / (std(x) std(y)) of two samples, computed in float64;
    NaN when either is constant or fewer than 2 pairs are finite (pairs with a NaN are left out).

    Shape:
        x, y: [N]  ->  float in [-1, 1] or NaN
    """
    x, y = x.detach().double().flatten(), y.detach().double().flatten()
    ok = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[ok], y[ok]
    if x.numel() < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    denom = float(torch.sqrt((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum()) / denom if denom > 0 else float("nan")
