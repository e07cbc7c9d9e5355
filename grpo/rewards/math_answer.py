"""Math answers: extracting the final answer of a completion and comparing it with a reference by
symbolic equivalence (math-verify), so that ``\\frac{1}{2}``, ``0.5`` and ``1/2`` all match.

math-verify bounds its parsing and comparison time with ``signal.alarm``, which only works in the
main thread: there every call is limited to ``MATH_VERIFY_TIMEOUT`` seconds; in other threads it
runs without a time limit. A timeout or any exception inside math-verify counts as "no match".
"""

from __future__ import annotations

import re
import threading
from typing import Any

from grpo.rewards.text import answer_block, as_text

#: Seconds math-verify may spend parsing one answer, or comparing two (main thread only).
MATH_VERIFY_TIMEOUT = 5

_BOXED_RE = re.compile(r"\\boxed\s*\{")


def balanced_end(text: str, start: int) -> int | None:
    """Index of the ``}`` closing the brace opened just before ``start`` (``\\{`` and ``\\}`` are
    skipped as escaped braces); None when it is never closed."""
    depth, i = 1, start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return i
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Stripped content of the last ``\\boxed{...}`` (balanced braces); None when there is none, it is
    empty, or its braces never close."""
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return None
    end = balanced_end(text, matches[-1].end())
    content = None if end is None else text[matches[-1].end():end].strip()
    return content or None


def extract_answer_tag(text: str) -> str | None:
    """Stripped content of the last closed ``<answer>…</answer>`` block; None when there is none or
    it is empty (grpo.rewards.text.answer_block)."""
    return answer_block(text) or None


def final_answer(completion: Any) -> str | None:
    """The answer a completion gives: inside the last ``<answer>…</answer>`` block when there is one
    (its last ``\\boxed{}`` if it has one, else the whole block), otherwise the last ``\\boxed{...}``
    of the completion; None when there is neither."""
    text = as_text(completion)
    block = extract_answer_tag(text)
    if block is not None:
        return extract_boxed(block) or block
    return extract_boxed(text)


def reference_answer(reference: Any) -> str | None:
    """The answer of a reference value: numbers as text; a worked solution (TRL's ``solution``
    column) reduced to its final answer as in :func:`final_answer`; None when empty."""
    if reference is None:
        return None
    text = str(reference).strip()
    return (final_answer(text) or text) if text else None


def _timeout() -> int | None:
    return MATH_VERIFY_TIMEOUT if threading.current_thread() is threading.main_thread() else None


def parse_answer(answer: str) -> list:
    """math-verify's parse of an answer (as the content of ``\\boxed{}``); [] when it fails."""
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        return parse("\\boxed{" + answer + "}", parsing_timeout=_timeout())
    except (Exception, TimeoutException):  # TimeoutException is a BaseException
        return []


def answers_match(answer: str, reference: str) -> bool:
    """Symbolic equivalence by math-verify; when either side does not parse, equality of the two
    texts with whitespace removed."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    gold, got = parse_answer(reference), parse_answer(answer)
    if not gold or not got:
        return "".join(answer.split()) == "".join(reference.split())
    try:
        return bool(verify(gold, got, timeout_seconds=_timeout()))
    except (Exception, TimeoutException):
        return False


def math_correct(completion: Any, reference: Any) -> bool | None:
    """Whether the completion's final answer equals the reference; None without a reference,
    False when the completion has no extractable answer."""
    ref = reference_answer(reference)
    if ref is None:
        return None
    answer = final_answer(completion)
    return answer is not None and answers_match(answer, ref)


def references(n: int, answer: list | None, solution: list | None) -> list:
    """Per completion the reference: the ``answer`` column, else ``solution`` (None if neither)."""
    def pick(i: int) -> Any:
        for column in (answer, solution):
            if column is not None and column[i] is not None and str(column[i]).strip():
                return column[i]
        return None

    return [pick(i) for i in range(n)]


def math_accuracy(prompts: list, completions: list, answer: list | None = None, solution: list | None = None,
                  **_: object) -> list[float | None]:
    """1.0 when the completion's final answer is mathematically equivalent to the reference, else 0.0.

    Final answer: see :func:`final_answer` (``<answer>`` block, else last ``\\boxed{}``); none -> 0.0.
    Reference: the ``answer`` column, or else ``solution`` (TRL math datasets; a worked solution is
    reduced to its last ``\\boxed{}``); no reference -> None (does not apply). Comparison: math-verify
    (``\\frac{1}{2}`` = ``0.5`` = ``1/2``, ``1,000`` = ``1000``, sets, intervals), falling back to text
    equality when an answer does not parse; a math-verify timeout or error -> 0.0.
    """
    refs = references(len(completions), answer, solution)
    return [None if (ok := math_correct(c, r)) is None else float(ok) for c, r in zip(completions, refs)]
