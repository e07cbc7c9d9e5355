"""Learning-rate schedules: the multiplier of the peak rate at each optimizer step (GRPO and SFT alike)."""

from __future__ import annotations

import math

#: `optim.lr_scheduler` values.
SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, warmup_steps: int, total_steps: int, kind: str = "cosine", min_ratio: float = 0.0) -> float:
    """The learning rate of optimizer step `step` (0-based) as a fraction of the peak.

        warmup (step < W):   (step + 1) / (W + 1)
        then, with p = clip((step - W) / max(1, S - W), 0, 1):
            constant   1
            linear     m + (1 - m) (1 - p)
            cosine     m + (1 - m) (1 + cos(pi p)) / 2

    W = `warmup_steps`, S = `total_steps`, m = `min_ratio` (the floor the decay ends at).
    """
    if kind not in SCHEDULES:
        raise ValueError(f"optim.lr_scheduler must be one of {' | '.join(SCHEDULES)}, got {kind!r}")
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min(max((step - warmup_steps) / max(1, total_steps - warmup_steps), 0.0), 1.0)
    decay = {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1.0 + math.cos(math.pi * progress))}[kind]
    return decay if kind == "constant" else min_ratio + (1.0 - min_ratio) * decay
