"""The agentic embedded task (docs/agents.md): arithmetic too large to do in the head, with a calculator.

A problem is ``a*b+c`` with a in 100..999, b in 11..99, c in 100..999 (``347*29+128=``; answer ``10191``).
A 0.8M-parameter model cannot multiply such numbers, but it can copy the expression into a tool call,
read the result and copy it into its answer:

    <tool_call>calc(347*29+128)</tool_call><tool_response>10191</tool_response><answer>10191</answer>

(the `call` tool parser; the tags are single tokens of the tool-use tokenizer, grpo.modeling.models
TOOL_TAG_TOKENS). The cold-start demonstrations mix such tool episodes with direct answers
(``<answer>10191</answer>``); the verifier is ``exact_match`` on the last ``<answer>`` block. Train/test
membership is decided by SHA-256 of the problem (10% held out), as in the other tasks.
"""

from __future__ import annotations

import random

from grpo.data.tasks.common import generate_rows, hashed_split, styled_rows

SPLITS = ("train", "test")
TEST_PERCENT = 10
#: The rewards of a run on this task when none is named.
DEFAULT_REWARDS = ("exact_match",)
#: The run settings the task needs (grpo demo --task calculator; docs/agents.md).
RUN_SETTINGS = {"rollout.env": "calculator", "rollout.tool_parser": "call", "rollout.max_turns": 2}


def solve(problem: str) -> int:
    a, rest = problem.split("*")
    b, c = rest.split("+")
    return int(a) * int(b) + int(c)


def split_of(problem: str) -> str:
    return hashed_split(problem, TEST_PERCENT)


def draw_problem(rng: random.Random) -> str:
    return f"{rng.randint(100, 999)}*{rng.randint(11, 99)}+{rng.randint(100, 999)}"


def generate(split: str, n: int, seed: int = 0, unique: bool = True) -> list[dict]:
    """``n`` rows ``{"prompt", "answer"}`` of `split`, a deterministic function of (split, n, seed)."""
    return generate_rows("calculator", split, n, seed, draw_problem, solve, unique)


def tool_completion(problem: str) -> str:
    """A tool episode as one text: the call, the calculator's response, the answer."""
    result = solve(problem)
    return f"<tool_call>calc({problem})</tool_call><tool_response>{result}</tool_response><answer>{result}</answer>"


def direct_completion(problem: str) -> str:
    return f"<answer>{solve(problem)}</answer>"


def sft_examples(n: int, seed: int = 0, tool_fraction: float = 0.3) -> list[dict]:
    """``n`` cold-start rows ``{"prompt", "completion", "answer"}`` of the train split: a tool episode with
    probability `tool_fraction`, else a direct answer."""
    return styled_rows("calculator", generate("train", n, seed=seed, unique=False), seed, tool_fraction,
                       "tool_fraction", tool_completion, direct_completion)
