"""Building the configuration tree (grpo/config/schema.py): defaults < preset < YAML file < overrides,
each value checked against its field's type, nested groups (``section.group.key``) included, and the
key listings that `--help-config` and the unknown-key error print."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

import yaml

from grpo.config.checks import validate
from grpo.config.coerce import coerce
from grpo.config.names import did_you_mean
from grpo.config.presets import preset_values
from grpo.config.schema import SECTIONS, Config, ConfigError
from grpo.config.trl import TRL_KEYS
from grpo.config.trl_vllm import VLLM_ROLLOUT_CORRECTION
from grpo.config.aliases import rename
from grpo.config.variants import (FLAT_ALIASES, Variant, merge, named, names_first, parameter_rows, put_alias,
                                  variant_table)


def _sub_config(cls: type, name: str) -> type | None:
    """The dataclass type of field `name` of `cls` when it is a nested group of keys (else None)."""
    if variant_table(cls, name) is not None:     # a registry entry with its parameters (grpo/config/variants.py)
        return None
    hint = typing.get_type_hints(cls).get(name)
    return hint if dataclasses.is_dataclass(hint) else None


def _keys(prefix: str, cls: type) -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        sub, table = _sub_config(cls, f.name), f.metadata.get("variant")
        out += _keys(f"{prefix}.{f.name}", sub) if sub else [f"{prefix}.{f.name}"]
        out += [key for key, _, _ in parameter_rows(f"{prefix}.{f.name}", table)] if table else []
    return out


def valid_keys() -> list[str]:
    """All `section.key` names (nested groups as `section.group.key`), in declaration order."""
    return [k for s, cls in SECTIONS.items() for k in _keys(s, cls)]


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    """An instance of config dataclass `cls` from `values` (nested groups from mappings); errors name the key."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise _unknown(f"{where}.{key}")
        sub = _sub_config(cls, key)
        if sub is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{where}.{key}' expects a mapping of "
                                  f"{', '.join(f.name for f in dataclasses.fields(sub))}, got {value!r}")
            kwargs[key] = _build(sub, value, f"{where}.{key}")
        elif variant_table(cls, key) is not None:
            kwargs[key] = value                   # checked against its registry entry by the dataclass itself
        else:
            kwargs[key] = coerce(f"{where}.{key}", value, fields[key].type)
    return cls(**kwargs)


def _unknown(key: str) -> ConfigError:
    """The error for an unknown key: the closest valid keys, then its section's keys (or the sections)."""
    section = key.partition(".")[0]
    keys = valid_keys()
    if section in SECTIONS:
        listing = f"keys of section {section}: {', '.join(k for k in keys if k.startswith(section + '.'))}"
    else:
        listing = f"sections: {', '.join(SECTIONS)} (`grpo train --help-config` lists every key)"
    leaf = key.rpartition(".")[2]
    hint = did_you_mean(key, keys if "." in key else list(SECTIONS))
    if leaf in TRL_KEYS and not hint:                    # a TRL name under a section: 'optim.learning_rate'
        hint = f" (did you mean '{TRL_KEYS[leaf][0]}', TRL's {leaf}?)"
    return ConfigError(f"unknown config key '{key}'{hint}; {listing}")


def _put(merged: dict[str, dict[str, Any]], dotted: str, value: Any) -> None:
    """Set `section.key` (or `section.group.key`: one key of a nested group, or a parameter of a variant) in
    `merged`; a renamed key under its new name (grpo/config/aliases.py)."""
    section, _, key = rename(dotted).partition(".")
    if section not in SECTIONS or not key:
        raise _unknown(dotted)
    target, *path = key.split(".")
    if section == "algorithm" and key in FLAT_ALIASES:      # algorithm.sapo_tau_pos -> policy_loss.tau_pos
        put_alias(merged[section], key, value)
    elif variant_table(SECTIONS[section], target) is not None:
        merged[section][target] = merge(f"{section}.{target}", merged[section].get(target), path, value)
    elif path:
        group = merged[section].setdefault(target, {})
        if not isinstance(group, dict) or _sub_config(SECTIONS[section], target) is None:
            raise _unknown(dotted)
        merged[section][target] = {**group, ".".join(path): value}
    else:
        merged[section][key] = value


def build_config(nested: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Build a validated Config from a nested dict (YAML) and flat `section.key` overrides. Under rollout.engine
    vllm, algorithm.rollout_correction not given anywhere is TRL's default (grpo/config/trl_vllm.py)."""
    merged: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    algo_section = (nested or {}).get("algorithm")
    preset = (overrides or {}).get("algorithm.preset") or (algo_section.get("preset") if isinstance(algo_section, dict) else None)
    if preset:  # the lowest layer: the YAML file and the overrides below replace any of its values
        for dotted, value in preset_values(str(preset)).items():
            _put(merged, dotted, value)
    for section, values in (nested or {}).items():
        if section not in SECTIONS:
            raise _unknown(str(section))
        if not isinstance(values, dict):
            raise ConfigError(f"config section '{section}' must be a mapping of keys to values")
        for key, value in values.items():                      # `group.key` inside a section: one key of a group
            if "." in str(key) or (isinstance(value, dict) and _sub_config(SECTIONS[section], str(key))):
                for sub, v in ({key: value} if "." in str(key) else {f"{key}.{k}": v for k, v in value.items()}).items():
                    _put(merged, f"{section}.{sub}", v)
            else:
                _put(merged, f"{section}.{key}", value)
    for dotted, value in names_first(overrides or {}).items():      # a variant's entry before its parameters
        _put(merged, dotted, value)
    if merged["rollout"].get("engine") == "vllm" and not named(merged["algorithm"], "rollout_correction"):
        _put(merged, "algorithm.rollout_correction.name", VLLM_ROLLOUT_CORRECTION)   # TRL corrects vLLM's samples unless told not to
    cfg = Config(**{section: _build(cls, merged[section], section) for section, cls in SECTIONS.items()})
    validate(cfg)                             # the cross-field rules (grpo/config/checks.py)
    return cfg


def demo_output_dir(out_dir: str | Path, overrides: dict[str, Any] | None = None) -> Path:
    """A demo's output directory: `--train.output_dir` when given (the training run writes there, so the demo's
    plots, summary and report must read and write there too), else `out_dir` (`--out` or the demo's default)."""
    return Path((overrides or {}).get("train.output_dir") or out_dir)


def demo_config(base: dict[str, Any], output_dir: str | Path, seed: int, steps: int | None = None,
                overrides: dict[str, Any] | None = None) -> Config:
    """A demo's settings: `base` (nested) with train.output_dir and train.seed, `steps` as train.max_steps
    when given, then `overrides` (flat keys) last."""
    flat = {"train.output_dir": str(output_dir), "train.seed": seed, "train.overwrite_output_dir": True,
            **(overrides or {})}                      # a demo re-run starts over in its directory
    if steps is not None:
        flat["train.max_steps"] = steps
    return build_config(base, flat)


class DuplicateKey(Exception):
    """A mapping of a YAML file holds `key` twice (its second occurrence at `line`, 1-based)."""

    def __init__(self, key: Any, line: int):
        super().__init__(key, line)
        self.key, self.line = key, line


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key) if isinstance(key, (str, int, float, bool)) else None
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file; errors name the file (and line, when YAML reports one)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(), Loader=UniqueKeyLoader)
    except DuplicateKey as e:
        raise ConfigError(f"{p}:{e.line}: key '{e.key}' appears twice in one mapping (the second would silently "
                          "replace the first)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{p}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return data


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as a nested plain dict (for YAML/JSON dumps); a variant as {name, its parameters}."""
    out = dataclasses.asdict(cfg)
    for section in SECTIONS:
        for key, value in vars(getattr(cfg, section)).items():
            if isinstance(value, Variant):
                out[section][key] = value.as_dict()
    return out


def field_help() -> list[tuple[str, Any, str]]:
    """(key, default, help) for every config key, for `--help-config`."""
    rows: list[tuple[str, Any, str]] = []

    def walk(prefix: str, cls: type, default: Any) -> None:
        for f in dataclasses.fields(cls):
            sub = _sub_config(cls, f.name)
            if sub is not None:
                walk(f"{prefix}.{f.name}", sub, getattr(default, f.name))
            else:
                value = getattr(default, f.name)
                rows.append((f"{prefix}.{f.name}", str(value) if isinstance(value, Variant) else value,
                             f.metadata.get("help", "")))
                rows.extend(parameter_rows(f"{prefix}.{f.name}", f.metadata["variant"]) if "variant" in f.metadata else [])

    default = Config()
    for section, cls in SECTIONS.items():
        walk(section, cls, getattr(default, section))
    return rows


def steps_for_epochs(epochs: float, prompts: int, prompts_per_step: int) -> int:
    """GRPO steps for `epochs` passes over `prompts` training prompts, `prompts_per_step` a step:
    ``ceil(epochs * ceil(prompts / prompts_per_step))``, at least 1 (transformers' ``max_steps`` for
    ``num_train_epochs``, counted in generation batches: one step draws each of its prompts once)."""
    per_epoch = max(1, math.ceil(prompts / prompts_per_step))
    return max(1, math.ceil(epochs * per_epoch))


def with_epochs(cfg: Config, prompts: int) -> Config:
    """`cfg` with train.max_steps set from train.num_train_epochs (> 0) and the training set's size; as given
    otherwise."""
    tc = cfg.train
    if tc.num_train_epochs <= 0:
        return cfg
    steps = steps_for_epochs(tc.num_train_epochs, prompts, tc.prompts_per_step)
    return dataclasses.replace(cfg, train=dataclasses.replace(tc, max_steps=steps))
