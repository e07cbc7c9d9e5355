"""Tool calls in the model's text: `<tool_call>...</tool_call>` blocks, parsed by a registry of formats.

    qwen   <tool_call>{"name": "calc", "arguments": {"expression": "2+2"}}</tool_call>   (Qwen-style templates)
    call   <tool_call>calc(2+2)</tool_call>   (the text inside the parentheses is one string argument, passed
           to the tool's first parameter; short enough for small models: the calculator demo uses it)

A turn ends when the text generated since the last observation ends with the close tag. A parser
failure is a :class:`ToolCallError` whose message goes back to the model as an error observation.
`rollout.tool_parser` names one of :data:`PARSERS`, or `file.py:function` taking the text inside the
tags and returning (name, arguments dict).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ToolCallError(ValueError):
    """A tool call that cannot be parsed or run; its message is the observation the model reads."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    positional: tuple[Any, ...] = ()
    text: str = ""                      # the raw text between the tags


def call_body(text: str) -> str:
    """The text between the last `<tool_call>` and the closing tag of a turn ending with a call (without an
    opening tag: the whole turn before the closing tag, as when a template opens the block itself)."""
    end = text.rstrip().rfind(CLOSE)
    if end < 0:
        raise ToolCallError(f"a tool call must be written {OPEN}...{CLOSE}")
    start = text.rfind(OPEN, 0, end)
    return text[start + len(OPEN) if start >= 0 else 0:end].strip()


def ends_with_call(text: str) -> bool:
    return text.rstrip().endswith(CLOSE)


def parse_qwen(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except ValueError as e:
        raise ToolCallError(f"tool call is not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ToolCallError('tool call JSON needs {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):                                   # some models double-encode the arguments
        try:
            args = json.loads(args)
        except ValueError:
            raise ToolCallError("tool call arguments are not a JSON object") from None
    if not isinstance(args, dict):
        raise ToolCallError("tool call arguments are not a JSON object")
    return ToolCall(obj["name"], args, (), body)


CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$", re.S)


def parse_call(body: str) -> ToolCall:
    m = CALL.match(body)
    if m is None:
        raise ToolCallError("tool call must look like name(argument)")
    return ToolCall(m.group(1), {}, (m.group(2),) if m.group(2) != "" else (), body)


PARSERS: dict[str, Callable[[str], ToolCall]] = {"qwen": parse_qwen, "call": parse_call}


def load_parser(spec: str) -> Callable[[str], ToolCall]:
    """A parser by registry name or `file.py:function` (returning (name, arguments) or a ToolCall)."""
    if spec in PARSERS:
        return PARSERS[spec]
    if ":" not in spec:
        raise ValueError(f"rollout.tool_parser: unknown parser {spec!r}; choose from {', '.join(PARSERS)} "
                         f"or give file.py:function")
    from grpo.rewards import load_file_reward

    path, _, name = spec.rpartition(":")
    fn = load_file_reward(path, name)[1]

    def custom(body: str) -> ToolCall:
        out = fn(body)
        if isinstance(out, ToolCall):
            return out
        try:
            name, args = out
        except (TypeError, ValueError):
            raise ToolCallError(f"{spec} must return (name, arguments)") from None
        return ToolCall(str(name), dict(args), (), body)

    return custom
