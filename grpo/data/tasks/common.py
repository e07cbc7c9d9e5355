"""What the embedded tasks share: a SHA-256 train/test split, the row generator built on it and the mix of
completion styles of their SFT rows."""

from __future__ import annotations

import hashlib
import random
from typing import Callable

SPLITS = ("train", "test")


def hashed_split(problem: str, test_percent: int = 10) -> str:
    """``"test"`` for `test_percent`% of problems (by SHA-256 of the text), else ``"train"``: disjoint splits
    whatever the seed."""
    bucket = int.from_bytes(hashlib.sha256(problem.encode("utf-8")).digest()[:8], "big") % 100
    return "test" if bucket < test_percent else "train"


def generate_rows(task: str, split: str, n: int, seed: int, draw: Callable[[random.Random], str],
                  solve: Callable[[str], object], unique: bool = True) -> list[dict]:
    """``n`` rows ``{"prompt": "<problem>=", "answer"}`` of `split`: problems drawn by `draw` from a generator
    seeded by (task, split, seed), kept when they hash into `split` (and are new, with `unique`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"{task}:{split}:{seed}")
    rows, seen = [], set()
    while len(rows) < n:
        problem = draw(rng)
        if hashed_split(problem) != split or (unique and problem in seen):
            continue
        seen.add(problem)
        rows.append({"prompt": f"{problem}=", "answer": str(solve(problem))})
    return rows


def styled_rows(task: str, rows: list[dict], seed: int, fraction: float, name: str,
                styled: Callable[[str], str], direct: Callable[[str], str]) -> list[dict]:
    """SFT rows ``{**row, "completion"}`` of prompt rows: each completion `styled` (worked, a tool episode) with
    probability `fraction` (the argument `name`, checked to lie in [0, 1]), else `direct`; the styles drawn
    from a generator seeded by (task, seed)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {fraction}")
    style = random.Random(f"{task}:style:{seed}")
    return [{**r, "completion": (styled if style.random() < fraction else direct)(r["prompt"].removesuffix("="))}
            for r in rows]
