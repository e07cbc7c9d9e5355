"""Multi-turn environments and tools (docs/agents.md): the environment protocol, tool-call parsers, safe
tool execution, and the driver that plays G episodes per prompt through grpo/rollout/multiturn.py."""

from grpo.envs.environment import ENVIRONMENTS, CalculatorEnv, EnvFactory, ToolEnv, load_env
from grpo.envs.parsers import PARSERS, ToolCall, ToolCallError
from grpo.envs.tools import calc, run_tool, tool_schema

__all__ = ["ENVIRONMENTS", "CalculatorEnv", "EnvFactory", "PARSERS", "ToolCall", "ToolCallError", "ToolEnv",
           "calc", "load_env", "run_tool", "tool_schema"]
