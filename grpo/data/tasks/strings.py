"""The second embedded domain: string manipulation in the embedded tokenizer's characters.

A problem is ``reverse:<word>`` (the word backwards) or ``sort:<word>`` (its letters in alphabetical
order), with a word of 3-6 lower-case letters; the prompt is ``<problem>=``, the reference ``answer``
the resulting string. Train/test membership is decided by SHA-256 of the problem (10% held out), as in
the arithmetic task, so the splits are disjoint whatever the seed. The verifier is ``exact_match``
(the last ``<answer>`` block equals the answer) and the format reward; worked demonstrations spell the
word out in the ``<think>`` block.
"""

from __future__ import annotations

import hashlib
import random

SPLITS = ("train", "test")
OPS = ("reverse", "sort")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TEST_PERCENT = 10
#: The rewards of a run on this task when none is named.
DEFAULT_REWARDS = ("exact_match", "format")


def solve(problem: str) -> str:
    """``reverse:abc`` -> ``cba``; ``sort:cab`` -> ``abc``."""
    op, _, word = problem.partition(":")
    if op not in OPS or not word.isalpha():
        raise ValueError(f"not a strings problem: {problem!r}")
    return word[::-1] if op == "reverse" else "".join(sorted(word))


def split_of(problem: str) -> str:
    bucket = int.from_bytes(hashlib.sha256(problem.encode("utf-8")).digest()[:8], "big") % 100
    return "test" if bucket < TEST_PERCENT else "train"


def make_prompt(problem: str) -> str:
    return f"{problem}="


def generate(split: str, n: int, seed: int = 0, unique: bool = True) -> list[dict]:
    """``n`` rows ``{"prompt", "answer"}`` of `split`, a deterministic function of (split, n, seed)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"strings:{split}:{seed}")
    rows, seen = [], set()
    while len(rows) < n:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6)))
        problem = f"{rng.choice(OPS)}:{word}"
        if split_of(problem) != split or (unique and problem in seen):
            continue
        seen.add(problem)
        rows.append({"prompt": make_prompt(problem), "answer": solve(problem)})
    return rows


def worked_completion(problem: str) -> str:
    """``<think>a,b,c</think><answer>cba</answer>``: the letters, then the result."""
    word = problem.partition(":")[2]
    return f"<think>{','.join(word)}</think><answer>{solve(problem)}</answer>"


def sft_examples(n: int, seed: int = 0) -> list[dict]:
    """``n`` cold-start rows ``{"prompt", "completion", "answer"}`` from the train split."""
    rows = generate("train", n, seed=seed, unique=False)
    return [{**r, "completion": worked_completion(r["prompt"].removesuffix("="))} for r in rows]
