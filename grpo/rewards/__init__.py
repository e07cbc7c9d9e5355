"""Reward functions: the protocol, loading them by name, and scoring.

A reward function is called by keyword, exactly as TRL's GRPOTrainer calls it::

    fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        -> list[float | None]

so a function written for TRL (``def accuracy(completions, solution, **kwargs)``) works unchanged;
take ``**kwargs`` for the arguments you do not name. It returns one value per completion; every
dataset column (e.g. ``answer``) is passed by name, one value per completion, and the trainer adds
``completion_ids`` (each completion's token ids, as TRL does). A completion is a string, or for a
conversational prompt (a list of chat messages) ``[{"role": "assistant", "content": text}]``.
Step (process) reward functions get ``steps=`` too (grpo/rewards/process.py). ``None`` means
"does not apply to this sample": it is left out of that function's mean and of the weighted sum;
a completion for which every function returns None gets no reward (total NaN, advantage 0).
``async def`` functions are awaited concurrently (grpo/rewards/scoring.py, which also describes
error handling and ``reward.reward_errors``).

A reward is named by a spec (``--reward`` / ``reward.functions``):

* a built-in name (grpo/rewards/builtin.py lists them), optionally with parameters:
  ``cosine_length:max_len=512,wrong_at_0=-1`` (the whole spec is then the reward's name);
* ``path/to/file.py:function`` (sync or ``async def``), or an import path ``package.module.function``
  (resolved from the working directory first, as TRL's ``reward_funcs``);
* a reward-model directory (grpo/rewards/reward_model.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import yaml

from grpo.rewards.builtin import BUILTIN_REWARDS, REWARD_FACTORIES
from grpo.rewards.scoring import REWARD_ERROR_MODES, RewardError, RewardFn, call_one, score
from grpo.rewards.verl import adapt_reward

__all__ = ["BUILTIN_REWARDS", "REWARD_ERROR_MODES", "REWARD_FACTORIES", "RewardError", "RewardFn", "load_reward",
           "score"]

# process.py (step rewards) calls one function through this name.
_call = call_one


def _convert(name: str, key: str, raw: str, default: Any) -> Any:
    """A parameter's text as the type of its default: text for strings, YAML otherwise."""
    if isinstance(default, str):
        return raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    if isinstance(default, bool) and not isinstance(value, bool):
        raise RewardError(f"reward '{name}': parameter {key} must be true or false, got '{raw}'")
    if isinstance(default, (int, float)) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RewardError(f"reward '{name}': parameter {key} must be a number, got '{raw}'")
    return value


def parse_params(name: str, text: str) -> dict[str, Any]:
    """'max_len=512,cache=64' -> {'max_len': 512, 'cache': 64}, checked against the factory of ``name``."""
    factory = REWARD_FACTORIES.get(name)
    if factory is None:
        raise RewardError(f"reward '{name}' takes no parameters (these do: {', '.join(sorted(REWARD_FACTORIES))})")
    accepted = inspect.signature(factory).parameters
    params: dict[str, Any] = {}
    for item in (s.strip() for s in text.split(",")):
        key, eq, raw = (part.strip() for part in item.partition("="))
        if not eq or not key:
            raise RewardError(f"reward '{name}': parameter '{item}' must be key=value")
        if key not in accepted:
            raise RewardError(f"reward '{name}' has no parameter '{key}' (parameters: {', '.join(accepted)})")
        params[key] = _convert(name, key, raw, accepted[key].default)
    return params


def load_builtin(spec: str) -> tuple[str, RewardFn]:
    """A built-in by name, or built by its factory from ``name:key=value,...``."""
    name, sep, text = spec.partition(":")
    if not sep:
        return name, BUILTIN_REWARDS[name]
    params = parse_params(name, text)
    return spec, REWARD_FACTORIES[name](**params)


def load_file_reward(path: str, fn_name: str) -> tuple[str, RewardFn]:
    """``function`` of the Python file ``path`` (imported as a fresh module)."""
    file = Path(path)
    if not file.is_file():
        raise RewardError(f"reward file not found: {file}")
    module_spec = importlib.util.spec_from_file_location(f"grpo_user_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report which one failed and why, in one line
        raise RewardError(f"reward file {file} failed to import: {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise RewardError(f"reward file {file} has no function '{fn_name}'")
    return adapt_reward(fn_name, fn)                       # a verl compute_score: wrapped (grpo/rewards/verl.py)


def load_reward(spec: str) -> tuple[str, RewardFn]:
    """Resolve a built-in (with optional parameters), `path/to/file.py:function` or a reward-model
    directory to (name, function).

    A directory holding a single-label ``...ForSequenceClassification`` model becomes
    ``("rm:<dirname>", scorer)`` (see grpo/rewards/reward_model.py).
    """
    if spec.partition(":")[0] in BUILTIN_REWARDS:
        return load_builtin(spec)
    if Path(spec).is_dir():
        from grpo.rewards.reward_model import load_reward_model

        return load_reward_model(spec)
    path, sep, fn_name = spec.rpartition(":")
    if not sep and "." in spec and all(part.isidentifier() for part in spec.split(".")):
        return load_module_reward(spec)
    if not sep or not path.endswith(".py"):
        raise RewardError(f"unknown reward '{spec}': use one of {sorted(BUILTIN_REWARDS)}, path/to/file.py:function, "
                          "an import path package.module.function or a reward-model directory")
    return load_file_reward(path, fn_name)


def load_module_reward(spec: str) -> tuple[str, RewardFn]:
    """``package.module.function`` imported with the working directory on the path first (TRL's
    ``reward_funcs`` import paths)."""
    module_name, _, fn_name = spec.rpartition(".")
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module: report which one failed and why, in one line
        raise RewardError(f"reward '{spec}': module {module_name} failed to import: {type(e).__name__}: {e}") from None
    finally:
        if added:
            sys.path.remove(cwd)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise RewardError(f"reward '{spec}': module {module_name} has no function '{fn_name}'")
    return adapt_reward(fn_name, fn)                       # a verl compute_score: wrapped
