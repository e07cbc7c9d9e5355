"""The environment protocol of multi-turn rollouts (docs/agents.md).

An environment is any object with

    reset(row: dict) -> str | list[dict] | None    # the episode's first observation: a prompt (text or chat
                                                   # messages) replacing the row's, or None to keep it
    step(action) -> (observation: str, done: bool, info: dict)

sync or ``async def``. ``action`` is a :class:`~grpo.envs.parsers.ToolCall` when the model closed a tool
call, and the final text of the episode (a str) when it ended with EOS (the observation is then not
shown; ``done`` is implied). ``info`` may hold ``"reward"``: that turn's reward (logged as
env/turn_reward and given to reward functions as the ``turn_rewards`` column). A ``tools`` attribute
(plain functions with docstrings and type hints) is rendered into chat prompts through the tokenizer's
chat template (``tools=``).

:class:`ToolEnv` is the environment most runs need: it answers each tool call by running the named
tool (grpo/envs/tools.py: errors, hangs and huge outputs become error observations). One environment
object serves one episode: a class is instantiated per episode, an object is deep-copied.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from typing import Any, Callable

from grpo.envs.parsers import ToolCall
from grpo.envs.tools import BUILTIN_TOOLS, run_tool


class ToolEnv:
    """Runs the model's tool calls; the episode ends when the model stops calling tools (EOS)."""

    tools: list[Callable] = []
    timeout_s: float = 5.0
    max_chars: int = 512

    def __init__(self, tools: list[Callable] | None = None):
        if tools is not None:
            self.tools = list(tools)
        self.calls = self.errors = self.timeouts = 0

    def reset(self, row: dict) -> None:
        return None

    def step(self, action: Any) -> tuple[str, bool, dict]:
        if not isinstance(action, ToolCall):
            return "", True, {}
        result = run_tool({t.__name__: t for t in self.tools}, action, self.timeout_s, self.max_chars)
        return result.text, False, {"error": result.error, "timed_out": result.timed_out}


class CalculatorEnv(ToolEnv):
    """The calculator demo's environment: one tool, ``calc(expression)``."""

    tools = [BUILTIN_TOOLS["calc"]]


class PythonEnv(ToolEnv):
    """Code execution: ``python(code)`` runs in the reward sandbox and returns what it printed."""

    tools = [BUILTIN_TOOLS["python"]]
    timeout_s = 10.0


ENVIRONMENTS: dict[str, type] = {"calculator": CalculatorEnv, "python": PythonEnv}


def resolve(value: Any) -> Any:
    """The value of a sync or async call (an awaitable is run to completion)."""
    if inspect.isawaitable(value):
        async def wait():
            return await value
        return asyncio.run(wait())
    return value


class EnvFactory:
    """Makes one environment per episode from a class, an object (deep-copied) or a spec string."""

    def __init__(self, source: Any, timeout_s: float = 5.0, max_chars: int = 512):
        self.source, self.timeout_s, self.max_chars = source, timeout_s, max_chars
        for method in ("reset", "step"):
            if not callable(getattr(source, method, None)):
                name = getattr(source, "__name__", type(source).__name__)
                raise TypeError(f"environment {name} has no {method}() method (see docs/agents.md)")

    def make(self) -> Any:
        env = self.source() if isinstance(self.source, type) else copy.deepcopy(self.source)
        if isinstance(env, ToolEnv):
            env.timeout_s, env.max_chars = self.timeout_s, self.max_chars
        return env

    @property
    def tools(self) -> list[Callable]:
        return list(getattr(self.source, "tools", []) or [])


def load_env(spec: Any, timeout_s: float = 5.0, max_chars: int = 512) -> EnvFactory:
    """`rollout.env` (a built-in name or `file.py:Class`) or an object from the Python API, as a factory."""
    if isinstance(spec, str):
        if spec in ENVIRONMENTS:
            spec = ENVIRONMENTS[spec]
        elif ":" in spec:
            from grpo.rewards import load_file_reward

            path, _, name = spec.rpartition(":")
            spec = load_file_reward(path, name)[1]
        else:
            raise ValueError(f"rollout.env: unknown environment {spec!r}; choose from {', '.join(ENVIRONMENTS)} "
                             f"or give file.py:Class")
    return EnvFactory(spec, timeout_s, max_chars)
