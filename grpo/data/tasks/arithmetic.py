"""Embedded arithmetic task: problem generator, demonstrations and verifier.

Problems are short integer expressions such as ``47+28-19`` whose prompt is the
expression followed by ``=``.  A completion reasons inside ``<think>…</think>``
and answers inside ``<answer>…</answer>``.  Two demonstration styles exist:

* *worked*: ``<think>47+28=75,75-19=56</think><answer>56</answer>`` (one binary
  operation per step, left to right);
* *direct*: ``<think></think><answer>56</answer>`` (no working shown).

The ``train`` / ``test`` split of a problem is decided by a stable hash
(SHA-256) of its canonical string, so the two splits are disjoint by
construction and identical across processes and machines.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from grpo.rewards.text import (ANSWER_CLOSE, ANSWER_OPEN, TAGS, THINK_CLOSE, THINK_OPEN,  # noqa: F401
                               answer_block, integer_answer_correct, parse_int, think_answer_parts)

SPLITS = ("train", "test")
#: The rewards of a run on this task when none is named (integer answer, and the think/answer format).
DEFAULT_REWARDS = ("accuracy", "format")


@dataclass(frozen=True)
class TaskSpec:
    """Shape of the problems: operand count and range, operators, held-out share."""

    n_operands: int = 3
    low: int = 0
    high: int = 19
    ops: str = "+-"
    test_percent: int = 10
    #: Only keep problems whose left-to-right partial results are all >= 0.
    nonnegative: bool = False

    def space_size(self) -> int:
        """Number of distinct problems (before the train/test split and ``nonnegative`` filter)."""
        n_values = self.high - self.low + 1
        return n_values**self.n_operands * len(self.ops) ** (self.n_operands - 1)


#: The spec used by the embedded model and the demo: 4 operands in 0..19,
#: partial results never negative (see grpo/assets/arithmetic-sft/README.md for why).
DEFAULT_SPEC = TaskSpec(n_operands=4, low=0, high=19, nonnegative=True)


def _split_of(problem: str, spec: TaskSpec) -> str:
    """Deterministic split of a canonical problem string (independent of seeds)."""
    digest = hashlib.sha256(problem.encode("utf-8")).digest()
    bucket = int.from_bytes(digest[:8], "big") % 100
    return "test" if bucket < spec.test_percent else "train"


def split_of(problem: str, spec: TaskSpec = DEFAULT_SPEC) -> str:
    """Return ``"train"`` or ``"test"`` for the expression ``problem`` (e.g. ``"47+28-19"``)."""
    return _split_of(problem, spec)


def evaluate_steps(problem: str) -> list[tuple[int, str, int, int]]:
    """Evaluate ``problem`` left to right; return ``(lhs, op, rhs, result)`` per step."""
    tokens = re.findall(r"\d+|[+-]", problem)
    if not tokens or len(tokens) % 2 == 0:
        raise ValueError(f"not a +/- expression: {problem!r}")
    acc = int(tokens[0])
    steps = []
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        rhs = int(operand)
        result = acc + rhs if op == "+" else acc - rhs
        steps.append((acc, op, rhs, result))
        acc = result
    return steps


def solve(problem: str) -> int:
    """Integer value of a +/- expression, evaluated left to right."""
    steps = evaluate_steps(problem)
    return steps[-1][3] if steps else int(problem)


def _random_problem(rng: random.Random, spec: TaskSpec) -> str:
    parts = [str(rng.randint(spec.low, spec.high))]
    for _ in range(spec.n_operands - 1):
        parts.append(rng.choice(spec.ops))
        parts.append(str(rng.randint(spec.low, spec.high)))
    return "".join(parts)


def make_prompt(problem: str) -> str:
    """Prompt shown to the model: the expression followed by ``=``."""
    return problem + "="


def generate(split: str, n: int, seed: int = 0, spec: TaskSpec = DEFAULT_SPEC, unique: bool = True) -> list[dict]:
    """Return ``n`` rows ``{"prompt", "answer"}`` from ``split`` ("train" or "test").

    Rows are a deterministic function of ``(split, n, seed, spec)``.  With
    ``unique=True`` no problem repeats within the call (``ValueError`` if the
    split cannot supply ``n`` distinct problems in reasonable time).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"arithmetic:{split}:{seed}")
    rows: list[dict] = []
    seen: set[str] = set()
    budget = 200 * n + 10_000
    while len(rows) < n:
        budget -= 1
        if budget < 0:
            raise ValueError(f"cannot draw {n} distinct {split!r} problems from {spec}")
        problem = _random_problem(rng, spec)
        if _split_of(problem, spec) != split or (unique and problem in seen):
            continue
        if spec.nonnegative and any(step[3] < 0 for step in evaluate_steps(problem)):
            continue
        seen.add(problem)
        rows.append({"prompt": make_prompt(problem), "answer": str(solve(problem))})
    return rows


def problem_of(prompt: str) -> str:
    """Inverse of :func:`make_prompt`."""
    return prompt.strip().removesuffix("=")


def worked_completion(problem: str) -> str:
    """Completion showing one binary operation per step, e.g. ``<think>47+28=75,75-19=56</think>…``."""
    steps = evaluate_steps(problem)
    work = ",".join(f"{a}{op}{b}={r}" for a, op, b, r in steps)
    return f"{THINK_OPEN}{work}{THINK_CLOSE}{ANSWER_OPEN}{solve(problem)}{ANSWER_CLOSE}"


def with_solutions(rows: list[dict]) -> list[dict]:
    """`rows` (from :func:`generate`) with a ``solution`` column: each prompt's :func:`worked_completion`, the
    reference that EDGE-GRPO's guided error correction injects (``algorithm.solution_column``)."""
    return [{**row, "solution": worked_completion(problem_of(row["prompt"]))} for row in rows]


def direct_completion(problem: str) -> str:
    """Completion with empty reasoning: ``<think></think><answer>56</answer>``."""
    return f"{THINK_OPEN}{THINK_CLOSE}{ANSWER_OPEN}{solve(problem)}{ANSWER_CLOSE}"


def sft_examples(n: int, seed: int = 0, worked_fraction: float = 0.25, spec: TaskSpec = DEFAULT_SPEC) -> list[dict]:
    """``n`` SFT rows ``{"prompt", "completion", "answer"}`` from the train split.

    Each row independently uses the worked style with probability
    ``worked_fraction`` and the direct style otherwise.  Problems may repeat
    (sampling is with replacement) so ``n`` may exceed the split size.
    """
    if not 0.0 <= worked_fraction <= 1.0:
        raise ValueError(f"worked_fraction must be in [0, 1], got {worked_fraction}")
    problems = [problem_of(r["prompt"]) for r in generate("train", n, seed=seed, spec=spec, unique=False)]
    style_rng = random.Random(f"arithmetic:style:{seed}")
    rows = []
    for problem in problems:
        worked = style_rng.random() < worked_fraction
        completion = worked_completion(problem) if worked else direct_completion(problem)
        rows.append({"prompt": make_prompt(problem), "completion": completion, "answer": str(solve(problem))})
    return rows


# --------------------------------------------------------------------------- verifier
# One parser of the format for the whole package (grpo.rewards.text); the task names its rules.


def extract_answer(completion: str) -> str | None:
    """Stripped content of the last ``<answer>…</answer>`` block, or ``None``."""
    return answer_block(completion)


def is_correct(completion: str, answer: str | int) -> bool:
    """True iff the extracted answer is an integer equal to ``answer``."""
    return integer_answer_correct(completion, answer)


def format_ok(completion: str) -> bool:
    """The task's format: ``<think>…</think><answer>…</answer>`` as :func:`grpo.rewards.text.think_answer_parts`
    parses it; the reasoning may be empty (the direct style)."""
    return think_answer_parts(completion) is not None


def is_worked(completion: str) -> bool:
    """True iff the ``<think>`` block of a well-formed completion is non-empty."""
    parts = think_answer_parts(completion)
    return bool(parts and parts[0].strip())
