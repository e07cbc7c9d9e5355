"""The stages of `grpo pipeline`, run in this process through the Python API behind each command: a stage's
args (its command's flags as a mapping, ``max-steps: 200``) become a Config for the sft and grpo stages and
the command's options for the sample, eval and reward_model stages, read as the command line reads them.

    sft           grpo.cli.sft.sft_from_config(Config)          (grpo sft --dataset ...)
    grpo          grpo.cli.common.run_training(Config, argv)    (grpo train)
    sample        grpo.cli.sample.cmd_sample(options)           (grpo sample)
    eval          grpo.cli.evaluation.cmd_eval(options)         (grpo eval)
    reward_model  grpo.cli.reward_model.cmd_reward_model(options)  (grpo reward-model)
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from grpo.cli import evaluation, reward_model, sample
from grpo.cli.common import FLAG_KEYS, option_values, read_given, resolve_read, run_training
from grpo.cli.sft import sft_from_config
from grpo.config import Config, ConfigError, build_config, load_yaml

#: The sft stage's own flags (grpo sft's dataset mode) and the config key each sets; other keys are `section.key`.
SFT_FLAGS = {"model": "model.path", "dataset": "data.dataset", "output_dir": "train.output_dir",
             "max_steps": "train.max_steps", "resume": "train.resume"}
#: Stage kinds run by their command's function with its options: kind -> (add_parser, command, function).
OPTION_KINDS: dict[str, tuple[Callable, str, Callable]] = {
    "sample": (sample.add_parser, "sample", sample.cmd_sample),
    "eval": (evaluation.add_parser, "eval", evaluation.cmd_eval),
    "reward_model": (reward_model.add_parser, "reward-model", reward_model.cmd_reward_model),
}


def given(args: dict[str, Any]) -> dict[str, Any]:
    """A stage's args as a command line gives them: a false or empty flag is not given, a `section.key` keeps
    its value (true / false too); flag names with dashes or underscores alike (``max-steps``)."""
    out = {}
    for key, value in args.items():
        if "." in key:
            out[key] = value
        elif value is not False and value is not None:
            out[key.replace("-", "_")] = value
    return out


def named_flags(values: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The config keys of the named flags among `values` (taken out of it), with the flags' types: integer steps
    and seed, text otherwise; a bare resume (true) is train.resume auto."""
    out = {}
    for key in [k for k in values if k in names]:
        value = values.pop(key)
        out[names[key]] = "auto" if value is True else int(str(value)) if key in ("max_steps", "seed") else str(value)
    return out


def grpo_config(args: dict[str, Any], target: str, resuming: bool) -> Config:
    """`grpo train`'s config of a grpo stage: its config file, TRL names, then `section.key`s, then the named
    flags (model, dataset, max-steps, seed, algorithm, reward), the stage's directory as train.output_dir."""
    values = given(args)
    config = values.pop("config", None)
    flags = named_flags(values, FLAG_KEYS)
    if "reward" in values:
        reward = values.pop("reward")
        flags["reward.functions"] = [str(r) for r in (reward if isinstance(reward, list) else [reward])]
    flags = {**flags, "train.output_dir": target, **({"train.resume": "auto"} if resuming else {})}
    trl, overrides = read_given(config, values)
    trl_flags = any("." not in k for k in values)
    return resolve_read(config, trl, {**overrides, **flags}, int(os.environ.get("WORLD_SIZE", "1")), trl_flags)


def sft_config(args: dict[str, Any], target: str, resuming: bool) -> Config:
    """`grpo sft`'s config of an sft stage (the dataset mode): its config file, its `section.key`s, then the named
    flags (model, dataset, max-steps), the stage's directory as train.output_dir."""
    values = given(args)
    config = values.pop("config", None)
    if not ({"dataset", "data.dataset"} & set(values) or config):
        raise ConfigError("an sft stage needs a dataset: args dataset, data.dataset or config")
    flags = {**named_flags(values, SFT_FLAGS), "train.output_dir": target}
    flags["train.resume"] = "auto" if resuming or flags.get("train.resume") else None    # a switch in grpo sft
    return build_config(load_yaml(config) if config else {},
                        {**option_values(values), **{k: v for k, v in flags.items() if v is not None}})


def command_options(add_parser: Callable, command: str, args: dict[str, Any]) -> argparse.Namespace:
    """The options of subcommand `command` (its parser's defaults) with a stage's args set, each converted and
    checked as the command line would (type, choices, repeated flags, required ones)."""
    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    actions = [a for a in sub.choices[command]._actions if a.dest != "help"]
    by_name = {opt[2:].replace("-", "_"): a for a in actions for opt in a.option_strings if opt.startswith("--")}
    options = {a.dest: a.default for a in actions}
    for key, value in given(args).items():
        action = by_name.get(key)
        if action is None:
            raise ConfigError(f"grpo {command}: unrecognised argument '--{key.replace('_', '-')}'")
        if isinstance(action, argparse._StoreTrueAction):
            options[action.dest] = bool(value)
            continue
        texts = [str(v) for v in (value if isinstance(value, list) else [value])]
        parsed = [action.type(t) if action.type else t for t in texts]
        for v in parsed:
            if action.choices is not None and v not in action.choices:
                raise ConfigError(f"grpo {command}: --{key} must be one of {', '.join(map(str, action.choices))}, "
                                  f"got {v!r}")
        options[action.dest] = parsed if isinstance(action, argparse._AppendAction) else parsed[-1]
    missing = [a.option_strings[0] for a in actions if a.required and options[a.dest] is None]
    if missing:
        raise ConfigError(f"grpo {command}: the following arguments are required: {', '.join(missing)}")
    return argparse.Namespace(**options)


def run_stage(kind: str, args: dict[str, Any], target: str, resuming: bool, argv: list[str]) -> int:
    """Run one stage writing to `target` (its directory, or a sample stage's JSONL); `argv` is the equivalent
    command line (the resume hint of a stopped grpo stage names it). The command's exit code."""
    if kind == "grpo":
        return run_training(grpo_config(args, target, resuming), argv)
    if kind == "sft":
        return sft_from_config(sft_config(args, target, resuming))
    add_parser, command, function = OPTION_KINDS[kind]
    options = command_options(add_parser, command, {**args, "out": target, **({"resume": True} if resuming else {})})
    return function(options, [])

