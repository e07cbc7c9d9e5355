"""Building the configuration tree (grpo/config/schema.py): defaults < preset < YAML file < overrides,
each value checked against its field's type, nested groups (``section.group.key``) included, and the
key listings that `--help-config` and the unknown-key error print."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from grpo.config.schema import SECTIONS, Config, ConfigError


def _sub_config(cls: type, name: str) -> type | None:
    """The dataclass type of field `name` of `cls` when it is a nested group of keys (else None)."""
    hint = typing.get_type_hints(cls).get(name)
    return hint if dataclasses.is_dataclass(hint) else None


def _keys(prefix: str, cls: type) -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        sub = _sub_config(cls, f.name)
        out += _keys(f"{prefix}.{f.name}", sub) if sub else [f"{prefix}.{f.name}"]
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
        else:
            kwargs[key] = _coerce(f"{where}.{key}", value, fields[key].type)
    return cls(**kwargs)


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check/convert one value against a field annotation; raise ConfigError naming the key."""
    hint = eval(annotation, vars(typing) | {"types": types}) if isinstance(annotation, str) else annotation  # noqa: S307
    args = typing.get_args(hint)
    optional = type(None) in args
    if value is None:
        if optional:
            return None
        raise ConfigError(f"config key '{key}' may not be empty")
    if optional:
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [_coerce(key, v, item) for v in value]
    if origin is dict:
        key_type, value_type = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' expects a mapping, got {value!r}")
        return {_coerce(key, k, key_type): _coerce(key, v, value_type) for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}' expects true/false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key '{key}' expects an integer, got {value!r}")
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):     # inf / nan pass every range check and end in NaN weights
                raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"config key '{key}' expects a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}' expects a string, got {value!r}")
    return value


def close_names(name: str, candidates: list[str], n: int = 3) -> list[str]:
    """The candidates most like `name`, best first: the same last part under another section ('train.lr' ->
    'optim.lr'; shallower keys first), then a near spelling of the last part among its siblings, or of the
    whole name (or a name it abbreviates) when its section is unknown too."""
    section, _, leaf = name.rpartition(".")
    leaf_of = {c: c.rpartition(".")[2] for c in candidates}
    same_leaf = sorted((c for c in candidates if leaf_of[c] == leaf), key=lambda c: c.count("."))
    siblings = {leaf_of[c]: c for c in candidates if c.rpartition(".")[0] == section}
    if section and siblings:
        near = [siblings[m] for m in difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)]
    else:                                    # a near spelling, or an abbreviation ('algo' -> 'algorithm')
        near = difflib.get_close_matches(name, candidates, n=n, cutoff=0.75)
        near += [c for c in candidates if len(name) >= 3 and c.startswith(name)]
    return list(dict.fromkeys(same_leaf + near))[:n]


def did_you_mean(name: str, candidates: list[str]) -> str:
    """The hint ` (did you mean 'x' or 'y'?)` for the closest candidates ('' when none is close)."""
    close = close_names(name, candidates)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _unknown(key: str) -> ConfigError:
    """The error for an unknown key: the closest valid keys, then its section's keys (or the sections)."""
    section = key.partition(".")[0]
    keys = valid_keys()
    if section in SECTIONS:
        listing = f"keys of section {section}: {', '.join(k for k in keys if k.startswith(section + '.'))}"
    else:
        listing = f"sections: {', '.join(SECTIONS)} (`grpo train --help-config` lists every key)"
    from grpo.config.trl import TRL_KEYS                    # a TRL name under a section: 'optim.learning_rate'

    leaf = key.rpartition(".")[2]
    hint = did_you_mean(key, keys if "." in key else list(SECTIONS))
    if leaf in TRL_KEYS and not hint:
        hint = f" (did you mean '{TRL_KEYS[leaf][0]}', TRL's {leaf}?)"
    return ConfigError(f"unknown config key '{key}'{hint}; {listing}")


def _put(merged: dict[str, dict[str, Any]], dotted: str, value: Any) -> None:
    """Set `section.key` (or `section.group.key`: one key of a nested group) in `merged`."""
    section, _, key = dotted.partition(".")
    if section not in SECTIONS or not key:
        raise _unknown(dotted)
    target, *path = key.split(".")
    if path:
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
        from grpo.config.presets import preset_values

        for dotted, value in preset_values(str(preset)).items():
            section, _, key = dotted.partition(".")
            merged[section][key] = value
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
                merged[section][key] = value
    for dotted, value in (overrides or {}).items():
        _put(merged, dotted, value)
    if merged["rollout"].get("engine") == "vllm" and "rollout_correction" not in merged["algorithm"]:
        from grpo.config.trl_vllm import VLLM_ROLLOUT_CORRECTION   # TRL corrects vLLM's samples unless told not to

        merged["algorithm"]["rollout_correction"] = VLLM_ROLLOUT_CORRECTION
    cfg = Config(**{section: _build(cls, merged[section], section) for section, cls in SECTIONS.items()})
    from grpo.config.checks import validate   # the cross-field rules live beside the schema

    validate(cfg)
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
    """The config as a nested plain dict (for YAML/JSON dumps)."""
    return dataclasses.asdict(cfg)


def field_help() -> list[tuple[str, Any, str]]:
    """(key, default, help) for every config key, for `--help-config`."""
    rows: list[tuple[str, Any, str]] = []

    def walk(prefix: str, cls: type, default: Any) -> None:
        for f in dataclasses.fields(cls):
            sub = _sub_config(cls, f.name)
            if sub is not None:
                walk(f"{prefix}.{f.name}", sub, getattr(default, f.name))
            else:
                rows.append((f"{prefix}.{f.name}", getattr(default, f.name), f.metadata.get("help", "")))

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
