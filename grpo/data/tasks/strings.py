"""The second embedded domain: string manipulation in the embedded tokenizer's characters.

A problem is ``reverse:<string>`` (the string backwards) or ``sort:<string>`` (its characters in
ascending order), with a string of 3-6 digits (``reverse:4719`` -> ``9174``, ``sort:4719`` -> ``1479``);
the prompt is ``<problem>=``, the reference ``answer`` the resulting string. Digits, not letters: the
embedded model's digit embeddings are trained, its letter embeddings are not, and a 0.8M-parameter model
learns to copy and reorder digits within a cold-start SFT of a few hundred steps (letters needed far
more). Train/test membership is decided by SHA-256 of the problem (10% held out), as in
the arithmetic task, so the splits are disjoint whatever the seed. The verifier is ``exact_match``
(the last ``<answer>`` block equals the answer) and the format reward; worked demonstrations spell the
word out in the ``<think>`` block.
"""

from __future__ import annotations

import hashlib
import random

from grpo.data.tasks.common import styled_rows

SPLITS = ("train", "test")
OPS = ("reverse", "sort")
ALPHABET = "0123456789"
TEST_PERCENT = 10
#: The rewards of a run on this task when none is named.
DEFAULT_REWARDS = ("exact_match", "format")


def solve(problem: str) -> str:
    """``reverse:123`` -> ``321``; ``sort:312`` -> ``123``."""
    op, _, word = problem.partition(":")
    if op not in OPS or not word or any(ch not in ALPHABET for ch in word):
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
        word = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(3, 6)))
        problem = f"{rng.choice(OPS)}:{word}"
        if split_of(problem) != split or (unique and problem in seen):
            continue
        seen.add(problem)
        rows.append({"prompt": make_prompt(problem), "answer": solve(problem)})
    return rows


def worked_completion(problem: str) -> str:
    """``<think>1,2,3</think><answer>321</answer>``: the characters one by one, then the result."""
    word = problem.partition(":")[2]
    return f"<think>{','.join(word)}</think><answer>{solve(problem)}</answer>"


def direct_completion(problem: str) -> str:
    """``<think></think><answer>321</answer>``: no working shown."""
    return f"<think></think><answer>{solve(problem)}</answer>"


def sft_examples(n: int, seed: int = 0, worked_fraction: float = 1.0) -> list[dict]:
    """``n`` cold-start rows ``{"prompt", "completion", "answer"}`` from the train split, each worked with
    probability `worked_fraction`, else direct."""
    return styled_rows("strings", generate("train", n, seed=seed, unique=False), seed, worked_fraction,
                       "worked_fraction", worked_completion, direct_completion)
