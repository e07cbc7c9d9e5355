"""What the subcommands of the command line share: reading `--section.key VALUE` and TRL flags into config
overrides, resolving a command's config, running `grpo train`'s config, the resume command line, the parser
class and one-line errors (a command's failure as exit code 2)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from typing import Any, Callable

import yaml

from grpo.config import Config, ConfigError, load_yaml
from grpo.config.trl import TRL_KEYS, check_known, is_trl_key, is_trl_name
from grpo.config.trl_values import BOOL_KEYS, LIST_KEYS, NEGATABLE, STR_KEYS, check_value, check_values

# Common options with flags of their own, and the config key each one sets.
FLAG_KEYS = {"model": "model.path", "dataset": "data.dataset", "output_dir": "train.output_dir",
             "max_steps": "train.max_steps", "seed": "train.seed", "algorithm": "algorithm.preset",
             "resume": "train.resume"}


def parse_overrides(tokens: list[str], trl: bool = False) -> dict[str, Any]:
    """['--a.b', '1', '--c.d=x'] -> {'a.b': 1, 'c.d': 'x'}; anything else is an error. With `trl`, TRL
    GRPOConfig names are taken too (`--learning_rate 1e-6`, `--num-generations 8`; a bare `--use_peft` is
    true, `--no_shuffle_dataset` false; a list key takes several values: `--reward_funcs a b`), under their
    TRL name, for grpo.config.trl to map; their values are checked here (errors name the flag as written)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        key, eq, value = tok[2:].partition("=")
        name = key.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in NEGATABLE and not eq
        is_trl = tok.startswith("--") and "." not in key and (is_trl_key(name) or negated)
        if is_trl and trl:
            flag, key = tok.partition("=")[0], name
            following = []
            while not eq and i + 1 + len(following) < len(tokens) and not tokens[i + 1 + len(following)].startswith("--"):
                following.append(tokens[i + 1 + len(following)])
                if name not in LIST_KEYS:
                    break                                          # one value; a list key takes them all (nargs +)
            i += len(following)
            if negated:
                if following:
                    raise ConfigError(f"TRL flag {flag} takes no value, got '{following[0]}'")
                key, parsed = name[3:], False
            elif not eq and not following:
                if name not in BOOL_KEYS:
                    raise ConfigError(f"TRL flag {flag} needs a value")
                parsed = True                                      # a bare TRL flag: --use_peft, --bf16
            else:
                texts = following or [value]
                raw = name in STR_KEYS or (LIST_KEYS.get(name) is str and not texts[0].startswith("["))
                parsed = [t if raw else _yaml_value(t) for t in texts]       # a run name "yes" stays "yes"
                parsed = parsed[0] if len(parsed) == 1 else parsed
            out[key] = check_value(key, parsed, f"TRL flag {flag}")
            i += 1
            continue
        if not tok.startswith("--") or "." not in tok:
            raise unrecognised(tok, name, is_trl)
        if not eq:
            if i + 1 >= len(tokens):
                raise ConfigError(f"config key '{key}' needs a value")
            value, i = tokens[i + 1], i + 1
        out[key] = _yaml_value(value)
        i += 1
    return out


def unrecognised(tok: str, name: str, is_trl: bool) -> ConfigError:
    """The error for option `tok` that is no `section.key` (nor, where TRL names are taken, a TRL flag)."""
    hint = f"; TRL's {name} is --{TRL_KEYS[name][0]} here" if is_trl and name in TRL_KEYS else ""
    if tok.startswith("--") and not hint and is_trl_name(name):    # eval_on_start, fsdp_config, ...
        return ConfigError(f"unrecognised argument '{tok}': '{name}' is a TRL / transformers TrainingArguments "
                           "key grpo does not map (docs/migrating-from-trl.md lists the mapped keys)")
    return ConfigError(f"unrecognised argument '{tok}' (config keys are given as --section.key VALUE{hint})")


def option_values(values: dict[str, Any], trl: bool = False) -> dict[str, Any]:
    """Options given as a mapping (`{"optim.lr": 1e-5, "learning_rate": 1e-6, "no_shuffle_dataset": true}`) as
    :func:`parse_overrides` reads them from the command line: `section.key` values as they are, TRL names (with
    `trl`) checked under their TRL name, anything else an error naming the flag. A text value is read as YAML
    as on the command line (TRL's text keys excepted)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in NEGATABLE and value is True
        is_trl = "." not in key and (is_trl_key(name) or negated)
        if isinstance(value, str) and name not in STR_KEYS:
            value = _yaml_value(value)                         # text read as on the command line: "false", "1e-6"
        if "." in key:
            out[key] = value
        elif is_trl and trl:
            out[name[3:] if negated else name] = False if negated else check_value(name, value, f"TRL flag --{key}")
        else:
            raise unrecognised(f"--{key}", name, is_trl)
    return out


def _yaml_value(text: str) -> Any:
    """A command-line value read as YAML (an empty one is None; unparsable YAML is the text itself)."""
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return text


def resolve_given(config: str | None, extra: list[str], flags: dict[str, Any], world_size: int = 1):
    """The Config of --config FILE, the extra options and a command's own `flags` (`section.key`, last); an error
    of the TRL keys mapped together names the file (and the TRL flags when some were given)."""
    given, overrides = read_given(config, extra)
    return resolve_read(config, given, {**overrides, **flags}, world_size,
                        any(t.startswith("--") and "." not in t.partition("=")[0] for t in extra))


def resolve_read(config: str | None, given: dict[str, Any], overrides: dict[str, Any], world_size: int = 1,
                 trl_flags: bool = False) -> Config:
    """The Config of what :func:`read_given` read and the `section.key` `overrides` (last); an error of the TRL
    keys mapped together names the file (and the TRL flags when `trl_flags`)."""
    from grpo.api.inputs import resolve_config

    try:
        return resolve_config(given, overrides, world_size=world_size)
    except ConfigError as e:
        if not config or not str(e).startswith("TRL key"):
            raise
        raise ConfigError(f"{config}{' with the TRL flags' if trl_flags else ''}: {e}") from None


def read_given(config: str | None, extra: list[str] | dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """--config FILE's keys (its TRL keys known and their values checked: errors name the file) and the extra
    options (TRL flags too; tokens, or a mapping as :func:`option_values` reads it), flags over the file, as
    (sections and TRL keys, `section.key` overrides)."""
    from grpo.api.inputs import split_keys

    given = load_yaml(config) if config else {}
    trl_keys = split_keys(given)[2]
    try:
        check_known(trl_keys)
        given.update(check_values(trl_keys))
    except ConfigError as e:
        raise ConfigError(f"{config}: {e}") from None
    given.update(option_values(extra, trl=True) if isinstance(extra, dict) else parse_overrides(extra, trl=True))
    return given, {k: given.pop(k) for k in [k for k in given if "." in k]}


def run_training(cfg: Config, argv: list[str]) -> int:
    """`grpo train` with config `cfg` through the Python API; `argv` (the command line) is what the resume hint of
    a stopped run repeats. The exit code: 0, or 128 + the signal that stopped the run."""
    from transformers.utils import logging as hf_logging

    from grpo.api.trainer import Trainer

    hf_logging.disable_progress_bar()   # per-checkpoint load/save bars would bury the run's own lines
    result = Trainer(config=cfg).train()
    if result.stopped_by:
        print(f"grpo: stopped by {result.stopped_by} after step {result.steps} of {cfg.train.max_steps}; "
              f"checkpoint: {result.checkpoint or 'none'}\nresume with: {resume_command(argv)}", file=sys.stderr)
        return 128 + result.signum
    if os.environ.get("RANK", "0") != "0":                     # torchrun: rank 0 reports for the run
        return 0
    print(f"done: {result.steps} steps in {result.wall_s:.0f}s; metrics in {result.output_dir / cfg.log.metrics_file}"
          + (f"; policy saved to {result.checkpoint}" if result.checkpoint else ""))
    return 0


def run_guarded(command: Callable[[], int], debug: bool = False) -> int:
    """`command()`'s exit code; a bad input or failed run (config, file, training, engine errors) as one line
    `error: ...` on stderr and exit code 2 (the traceback too with `debug`), Ctrl-C as 130."""
    from grpo.rollout.engine import EngineUnavailable     # late: the rollout and training packages load torch
    from grpo.training.guards import TrainingError

    try:
        return command()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ConfigError, ValueError, FileNotFoundError, OSError, TrainingError, EngineUnavailable) as e:
        if debug:
            traceback.print_exc()
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2


def resume_command(argv: list[str]) -> str:
    """The command line that continues a stopped run: `argv` with its resume options replaced by --resume."""
    kept, skip = [], False
    for i, tok in enumerate(argv):
        if skip:
            skip = False
            continue
        if tok in ("--resume", "--train.resume"):
            following = argv[i + 1] if i + 1 < len(argv) else "--"
            skip = tok == "--train.resume" or not following.startswith("--")
            continue
        if tok.startswith(("--resume=", "--train.resume=")):
            continue
        kept.append(tok)
    return shlex.join(["grpo", *kept, "--resume"])


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def one_line(e: BaseException) -> str:
    """An exception's message on one line (multi-line library messages joined)."""
    text = " ".join(part.strip() for part in str(e).splitlines() if part.strip())
    return text or type(e).__name__
