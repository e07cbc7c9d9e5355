"""What the embedded tasks share: a SHA-256 train/test split and the row generator built on it."""

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
