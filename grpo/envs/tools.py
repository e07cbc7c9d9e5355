"""Running tools safely: a tool is a plain Python function with a docstring and type hints.

Whatever a tool does, the run goes on: a tool that raises, does not return within `rollout.tool_timeout_s`
(its thread is abandoned), returns something that is not text and cannot be JSON-serialised, or returns
more than `rollout.max_observation_chars` characters (cut, with a marker) becomes an observation the model
reads (`error: ...`), counted in the metrics (tools/errors, tools/timeouts). Tools that run code use the
reward sandbox (grpo/rewards/sandbox.py): see :func:`python`.
"""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass
from typing import Any, Callable

from grpo.envs.parsers import ToolCall, ToolCallError
from grpo.rewards.calling import RewardTimeout, in_thread


@dataclass
class ToolResult:
    text: str                     # what the model reads
    error: bool = False
    timed_out: bool = False


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The JSON schema of a tool (transformers' get_json_schema: the docstring and type hints), as chat
    templates take it through ``tools=``."""
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


def _text(value: Any, max_chars: int) -> str:
    if not isinstance(value, str):
        try:
            value = json.dumps(value)
        except (TypeError, ValueError):
            raise ToolCallError(f"the tool returned a {type(value).__name__}, which is not text nor JSON") from None
    if len(value) > max_chars:
        value = value[:max_chars] + f"... [cut at {max_chars} characters]"
    return value


def run_tool(tools: dict[str, Callable], call: ToolCall, timeout_s: float, max_chars: int) -> ToolResult:
    """Call the tool `call` names with its arguments: its text, or an error observation."""
    fn = tools.get(call.name)
    if fn is None:
        return ToolResult(f"error: unknown tool {call.name!r}; tools: {', '.join(tools) or 'none'}", error=True)
    out = in_thread(lambda: fn(*call.positional, **call.arguments), timeout_s) if timeout_s > 0 else _direct(
        fn, call)
    if isinstance(out, RewardTimeout):
        return ToolResult(f"error: {call.name} did not return within {timeout_s:g} s", error=True, timed_out=True)
    if isinstance(out, BaseException):
        return ToolResult(f"error: {call.name} raised {type(out).__name__}: {out}"[:max_chars], error=True)
    try:
        return ToolResult(_text(out, max_chars))
    except ToolCallError as e:
        return ToolResult(f"error: {e}", error=True)


def _direct(fn: Callable, call: ToolCall) -> Any:
    try:
        return fn(*call.positional, **call.arguments)
    except Exception as e:  # noqa: BLE001 - the model reads it as an error observation
        return e


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv}


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("only numbers, + - * / // % and parentheses are allowed")


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % and parentheses, e.g. "347*29+1208".
    """
    value = _eval(ast.parse(expression.strip(), mode="eval"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def python(code: str) -> str:
    """Run a Python program in the sandbox and return what it printed.

    Args:
        code: the program; its standard output is the result.
    """
    from grpo.rewards.sandbox import run_sandboxed

    result = run_sandboxed(code, timeout=5.0)
    if result.timed_out:
        return "error: the program did not finish within 5 s"
    return result.stdout if result.returncode == 0 else f"error (exit {result.returncode}): {result.stderr[-500:]}"


BUILTIN_TOOLS: dict[str, Callable] = {"calc": calc, "python": python}
