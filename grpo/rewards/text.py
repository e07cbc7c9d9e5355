"""Format rewards for `<think>…</think><answer>…</answer>` completions, the one parser of that format,
and text helpers.

Tags are matched exactly: lower case, no attributes, no spaces inside the angle brackets.
:func:`think_answer_parts` is the only parser of the format (the embedded task's `format` and
`accuracy`, and `think_format`, all use it); :func:`answer_block` the only extractor of the answer.
"""

from __future__ import annotations

import re
from typing import Any

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
#: The four tags in the order a well-formed completion has them.
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
#: Credit per well-placed tag in tag_count.
TAG_CREDIT = 0.25

_THINK_FORMAT_RE = re.compile(
    r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>(?:\s*<\|[^<>|]*\|>)*\s*", re.DOTALL)
_ANSWER_BLOCK_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INT_RE = re.compile(r"[+-]?\d+")


def think_answer_parts(completion: str) -> tuple[str, str] | None:
    """``(reasoning, answer)`` of a completion that is exactly ``<think>R</think><answer>A</answer>``, else None.

    Rules: whitespace is allowed before, between and after the two blocks, and trailing special tokens
    (``<|endoftext|>``, ``<|im_end|>``, any ``<|...|>``) after them; nothing else may stand outside the
    blocks; neither part may contain any of the four tags (a repeated or nested tag is malformed). The
    parts are returned as written (not stripped); they may be empty."""
    match = _THINK_FORMAT_RE.fullmatch(completion)
    if match is None:
        return None
    parts = (match["think"], match["answer"])
    return None if any(tag in p for p in parts for tag in TAGS) else parts


def answer_block(text: str) -> str | None:
    """The stripped content of the last closed ``<answer>…</answer>`` block ("" when it is empty), or None."""
    blocks = _ANSWER_BLOCK_RE.findall(text)
    return blocks[-1].strip() if blocks else None


def parse_int(text: str | None) -> int | None:
    """An optionally signed decimal integer (surrounding whitespace allowed); anything else gives None."""
    if text is None or not _INT_RE.fullmatch(text.strip()):
        return None
    return int(text.strip())


def integer_answer_correct(completion: str, answer: str | int) -> bool:
    """True iff the last ``<answer>`` block holds an integer equal to `answer` (the embedded task's accuracy)."""
    got, want = parse_int(answer_block(completion)), parse_int(str(answer))
    return got is not None and want is not None and got == want


def as_text(completion: Any) -> str:
    """A completion as text: a string as is; a list of chat messages (TRL's conversational format)
    as the concatenated ``content`` of its messages; None as ""."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        return "".join(as_text(m) for m in completion)
    raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")


def chat_completion(prompt: Any, completion: Any) -> Any:
    """A completion as TRL hands it to reward functions: a text becomes
    ``[{"role": "assistant", "content": text}]`` when its prompt is a list of chat messages
    (conversational); anything else is returned as it is."""
    if isinstance(prompt, list) and isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    return completion


def chat_completions(prompts: list, completions: list) -> list:
    """:func:`chat_completion` of every (prompt, completion) pair."""
    return [chat_completion(p, c) for p, c in zip(prompts, completions)]


def reasoning_text(completion: str) -> str:
    """The reasoning part: the text between ``<think>`` and ``</think>`` (to the end when the block is
    not closed); without ``<think>``, the text before ``</think>`` (chat templates that open the
    block in the prompt); with neither tag, the whole completion."""
    start = completion.find(THINK_OPEN)
    if start >= 0:
        begin = start + len(THINK_OPEN)
        end = completion.find(THINK_CLOSE, begin)
        return completion[begin:] if end < 0 else completion[begin:end]
    end = completion.find(THINK_CLOSE)
    return completion[:end] if end >= 0 else completion


def is_think_format(completion: str) -> bool:
    """:func:`think_answer_parts` with non-blank reasoning and answer; see :func:`think_format`."""
    parts = think_answer_parts(completion)
    return parts is not None and all(p.strip() for p in parts)


def think_format(prompts: list, completions: list, **_: object) -> list[float]:
    """1.0 for a completion that is exactly ``<think>R</think><answer>A</answer>``, else 0.0.

    Whitespace policy: whitespace (spaces, tabs, newlines) is allowed before ``<think>``, between
    ``</think>`` and ``<answer>``, after ``</answer>`` and anywhere inside the two blocks; trailing
    chat special tokens such as ``<|im_end|>`` are ignored. R and A must each contain non-whitespace
    text and none of the four tags; any other text outside the blocks gives 0.0.
    """
    return [float(is_think_format(as_text(c))) for c in completions]


def tag_credit(completion: str) -> float:
    """0.25 per tag of TAGS that occurs exactly once and is in order with every other such tag."""
    unique = {k: completion.find(tag) for k, tag in enumerate(TAGS) if completion.count(tag) == 1}
    placed = [k for k, pos in unique.items()
              if all((other < pos) == (j < k) for j, other in unique.items() if j != k)]
    return TAG_CREDIT * len(placed)


def tag_count(prompts: list, completions: list, **_: object) -> list[float]:
    """Partial format credit: 0.25 for each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>``
    that occurs exactly once and in order.

    "In order" means: among the tags that occur exactly once, this tag is before every tag that
    comes after it in the list above and after every tag that comes before it. So a well-formed
    completion scores 1.0; one missing ``<think>`` (opened by the chat template) 0.75; a repeated
    tag loses only its own 0.25; ``<answer>…</answer><think>…</think>`` scores 0.0 (every tag is
    out of order with two others). Text around or between the tags does not matter.
    """
    return [tag_credit(as_text(c)) for c in completions]
