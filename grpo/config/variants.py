"""Variant keys of the `algorithm` section: a registry entry together with its own parameters (torchtune-style).

    algorithm:
      policy_loss: {name: sapo, tau_pos: 1.0, tau_neg: 1.05}     # or just `policy_loss: sapo` (its defaults)

Each variant key names a registry of grpo/algorithms/ (:data:`REGISTRIES`), whose ``*_PARAMS`` table declares
the parameters of every entry as a small dataclass (grpo/algorithms/params.py). The config holds a
:class:`Variant`: the entry's name and an instance of that dataclass, which the training code hands to the
entry. A parameter the named entry does not declare is an error naming the key and the allowed parameters.

The variant-prefixed flat keys of earlier versions (``algorithm.sapo_tau_pos``: :data:`FLAT_ALIASES`) still work
anywhere a key is read; each prints its new spelling once read (grpo/config/aliases.py) and, as before, sets a
parameter that counts only when the chosen entry has it (``sapo_tau_pos`` under ``policy_loss: clip`` changes
nothing). While build_config merges its layers a variant's value is a raw dict: ``name``, explicit parameters,
and under :data:`SCOPED` the values that came through flat aliases.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from grpo.algorithms.advantages import ADVANTAGE_PARAMS
from grpo.algorithms.entropy_advantages import ENTROPY_ADVANTAGE_PARAMS
from grpo.algorithms.entropy_control import ENTROPY_CONTROL_PARAMS
from grpo.algorithms.hybrid import CRITIC_PARAMS
from grpo.algorithms.lead import DIFFICULTY_WEIGHTING_PARAMS
from grpo.algorithms.policy_losses import POLICY_LOSS_PARAMS
from grpo.algorithms.shaping import GFPO_METRIC_PARAMS
from grpo.algorithms.stabilisers import OFF_POLICY_MASK_PARAMS, ROLLOUT_CORRECTION_PARAMS
from grpo.algorithms.token_preference import TOKEN_PREFERENCE_PARAMS
from grpo.config.aliases import announce
from grpo.config.coerce import coerce
from grpo.config.errors import ConfigError

#: algorithm key -> its registry's parameter table (entry name -> parameter dataclass).
REGISTRIES: dict[str, dict[str, type]] = {
    "advantage": ADVANTAGE_PARAMS,
    "policy_loss": POLICY_LOSS_PARAMS,
    "entropy_control": ENTROPY_CONTROL_PARAMS,
    "gfpo_filter": GFPO_METRIC_PARAMS,
    "rollout_correction": ROLLOUT_CORRECTION_PARAMS,
    "off_policy_mask": OFF_POLICY_MASK_PARAMS,
    "token_preference": TOKEN_PREFERENCE_PARAMS,
    "critic": CRITIC_PARAMS,
    "difficulty_weighting": DIFFICULTY_WEIGHTING_PARAMS,
    "entropy_advantage": ENTROPY_ADVANTAGE_PARAMS,
}

#: algorithm key -> the entry it names by default.
DEFAULT_ENTRY: dict[str, str] = {
    "advantage": "grpo", "off_policy_mask": "kl",
    "policy_loss": "clip", "entropy_control": "fixed", "gfpo_filter": "length", "rollout_correction": "none",
    "token_preference": "none", "critic": "none", "difficulty_weighting": "none", "entropy_advantage": "none",
}

#: Flat key of earlier versions -> (variant key, parameter; None = the entry's name).
FLAT_ALIASES: dict[str, tuple[str, str | None]] = {
    "advantage_estimator": ("advantage", None), "advantage_eps": ("advantage", "eps"),
    "scale_rewards": ("advantage", "scale_rewards"),
    "off_policy_mask_measure": ("off_policy_mask", None),
    "off_policy_mask_threshold": ("off_policy_mask", "threshold"),
    "clip_ratio_c": ("policy_loss", "ratio_c"), "clip_delta": ("policy_loss", "delta"),
    "cispo_max": ("policy_loss", "max"),
    "sapo_tau_pos": ("policy_loss", "tau_pos"), "sapo_tau_neg": ("policy_loss", "tau_neg"),
    "vespo_k_pos": ("policy_loss", "k_pos"), "vespo_lambda_pos": ("policy_loss", "lambda_pos"),
    "vespo_k_neg": ("policy_loss", "k_neg"), "vespo_lambda_neg": ("policy_loss", "lambda_neg"),
    "entropy_target": ("entropy_control", "target"), "entropy_coef_delta": ("entropy_control", "delta"),
    "entropy_coef_min": ("entropy_control", "coef_min"), "entropy_coef_max": ("entropy_control", "coef_max"),
    "gfpo_metric": ("gfpo_filter", None), "gfpo_sample_size": ("gfpo_filter", "sample_size"),
    "rollout_correction_min": ("rollout_correction", "min"), "rollout_correction_max": ("rollout_correction", "max"),
    "lambda_init": ("token_preference", "init"), "lambda_r": ("token_preference", "r"),
    "lambda_lr": ("token_preference", "lr"),
    "hybrid_alpha": ("critic", "alpha"), "value_lr": ("critic", "lr"), "value_steps": ("critic", "steps"),
    "difficulty_weight_min": ("difficulty_weighting", "w_min"), "difficulty_weight_max": ("difficulty_weighting", "w_max"),
    "difficulty_midpoint": ("difficulty_weighting", "midpoint"),
    "difficulty_steepness": ("difficulty_weighting", "steepness"),
    "entropy_reward_weight": ("entropy_advantage", "reward_weight"),
}

#: Key of a raw variant dict holding the flat aliases' values (each used only if the chosen entry declares it).
SCOPED = "@flat"


@dataclass(frozen=True, eq=False)
class Variant:
    """A registry entry and its parameters. Compares equal to its name (``policy_loss == "sapo"``) and hashes
    as it, so it indexes its registry directly; two Variants are equal when name and parameters are."""

    name: str
    params: Any

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.name == other
        return isinstance(other, Variant) and (self.name, self.params) == (other.name, other.params)

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def as_dict(self) -> dict[str, Any]:
        """``{name: ..., <parameter>: <value>, ...}``: the nested form a config file holds."""
        return {"name": self.name, **{f.name: getattr(self.params, f.name) for f in dataclasses.fields(self.params)}}


def variant_field(key: str, help: str) -> Any:
    """The dataclass field of variant key `key` (a registry of :data:`REGISTRIES`; default: :data:`DEFAULT_ENTRY`)."""
    table, default = REGISTRIES[key], DEFAULT_ENTRY[key]
    return field(default=Variant(default, table[default]()), metadata={"help": help, "variant": table})


def variant_table(cls: type, name: str) -> dict[str, type] | None:
    """The parameter table of field `name` of config dataclass `cls` when it is a variant key (else None)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return fields[name].metadata.get("variant") if name in fields else None


def parameter_rows(key: str, table: dict[str, type]) -> list[tuple[str, Any, str]]:
    """(``key.param``, default, help naming the entries) of every parameter of the registry, first seen first."""
    rows: dict[str, tuple[Any, str, list[str]]] = {}
    for entry, cls in table.items():
        for f in dataclasses.fields(cls):
            rows.setdefault(f.name, (f.default, f.metadata.get("help", ""), []))[2].append(entry)
    return [(f"{key}.{p}", default, f"({', '.join(entries)}) {text}") for p, (default, text, entries) in rows.items()]


def _raw(key: str, value: Any) -> dict[str, Any]:
    """A variant value as a raw dict: a name (str), a mapping, or a resolved Variant."""
    if isinstance(value, Variant):
        return value.as_dict()
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, str):
        return {"name": value}
    raise ConfigError(f"config key '{key}' expects an entry name or a mapping {{name: ..., <parameter>: ...}}, "
                      f"got {value!r}")


def merge(key: str, current: Any, path: list[str], value: Any) -> dict[str, Any]:
    """The raw value of variant key `key` after writing `value` at `path` ([]: the whole value, [p]: parameter p,
    ['name']: the entry). Naming another entry than the one named so far drops the old entry's parameters."""
    out = _raw(key, current) if current is not None else {}
    if not path:
        new = _raw(key, value)
        if "name" in new:                                   # the entry first: it decides which parameters go
            out = merge(key, out, ["name"], new.pop("name"))
        for k, v in new.items():
            out = merge(key, out, [k], v) if k != SCOPED else {**out, SCOPED: {**out.get(SCOPED, {}), **v}}
        return out
    param = ".".join(path)
    if param == "name":
        if out.get("name", value) != value:
            out = {k: v for k, v in out.items() if k == SCOPED}
        out["name"] = value
    else:
        out[param] = value
        if SCOPED in out:                                   # the later layer wins over an earlier flat alias
            out[SCOPED] = {p: v for p, v in out[SCOPED].items() if p != param}
    return out


def put_alias(section: dict[str, Any], old: str, value: Any, quiet: bool = False) -> None:
    """Write flat key `old` (of :data:`FLAT_ALIASES`) into the raw `section` dict, printing its new spelling."""
    key, param = FLAT_ALIASES[old]
    if not quiet:
        announce(f"algorithm.{old}", f"algorithm.{key}" + (f".{param}" if param else ""))
    raw = _raw(key, section[key]) if key in section else {}
    if param is None:
        section[key] = merge(f"algorithm.{key}", raw, ["name"], value)
        return
    raw.pop(param, None)
    section[key] = {**raw, SCOPED: {**raw.get(SCOPED, {}), param: value}}


def fold_translated(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat ``section.key`` dict made by a key translation (TRL's keys, grpo/config/trl.py) with its variant
    parameters (``algorithm.policy_loss.tau_pos``, or a flat alias) folded into the raw value of their variant key,
    quietly, each counting only when the chosen entry has it: TRL reads sapo_temperature_pos under loss_type sapo
    alone, and a GRPOConfig object carries every such field."""
    out: dict[str, Any] = {}
    section: dict[str, Any] = {}
    for dotted, value in flat.items():
        name, _, key = dotted.partition(".")
        variant, _, param = key.partition(".")
        if name == "algorithm" and key in FLAT_ALIASES:
            put_alias(section, key, value, quiet=True)
        elif name == "algorithm" and variant in REGISTRIES:
            raw = _raw(dotted, section[variant]) if variant in section else {}
            section[variant] = (merge(dotted, raw, [param] if param else [], value) if param in ("", "name")
                                else {**raw, SCOPED: {**raw.get(SCOPED, {}), param: value}})
        else:
            out[dotted] = value
    return {**out, **{f"algorithm.{key}": value for key, value in section.items()}}


def names_first(flat: dict[str, Any]) -> dict[str, Any]:
    """`flat` (``section.key`` -> value, one layer) with the keys that name a variant's entry first, so a parameter
    given before its entry's name in the same layer (``--algorithm.policy_loss.tau_pos 1.2 --algorithm.policy_loss
    sapo``) is not dropped as another entry's."""
    def names(dotted: str) -> bool:
        key = dotted.removeprefix("algorithm.").removesuffix(".name")
        return dotted.startswith("algorithm.") and (key in REGISTRIES or FLAT_ALIASES.get(key, ("", ""))[1] is None)

    return {**{k: v for k, v in flat.items() if names(k)}, **flat}


def named(section: dict[str, Any], key: str) -> bool:
    """Whether the raw `section` names the entry of variant key `key`."""
    value = section.get(key)
    return isinstance(value, (str, Variant)) or (isinstance(value, dict) and "name" in value)


def resolve(key: str, value: Any, table: dict[str, type], default: str) -> Variant:
    """The Variant of `value` (a name, a raw dict or a Variant) for config key `key`; ConfigError naming the key
    for an unknown entry, an unknown parameter or a bad value."""
    if isinstance(value, Variant) and value.name in table and isinstance(value.params, table[value.name]):
        return value
    raw = _raw(key, value)
    scoped = raw.pop(SCOPED, {})
    name = raw.pop("name", default)
    if not isinstance(name, str) or name not in table:
        raise ConfigError(f"{key} must be one of {sorted(table)}, got {name!r}")
    cls = table[name]
    declared = {f.name: f for f in dataclasses.fields(cls)}
    for param in raw:
        if param not in declared:
            allowed = ", ".join(declared) or "none"
            raise ConfigError(f"unknown parameter '{key}.{param}': {key} {name} takes {allowed}")
    hints = typing.get_type_hints(cls)
    given = {**{p: v for p, v in scoped.items() if p in declared}, **raw}
    values = {p: coerce(f"{key}.{p}", v, hints[p]) for p, v in given.items()}   # as every other key's value
    try:
        return Variant(name, cls(**values))
    except ValueError as e:                                  # the entry's own check of its values
        raise ConfigError(f"{key}.{e} ({name})") from None       # its messages start with a parameter's name


def resolve_fields(obj: Any, section: str) -> None:
    """In place (frozen dataclass `obj`): every variant field resolved to a Variant; ``__post_init__`` calls it."""
    for f in dataclasses.fields(obj):
        table = f.metadata.get("variant")
        if table is not None:
            object.__setattr__(obj, f.name, resolve(f"{section}.{f.name}", getattr(obj, f.name), table,
                                                    DEFAULT_ENTRY[f.name]))


def nested_algorithm(values: dict[str, Any]) -> dict[str, Any]:
    """An `algorithm` section as saved by any version (flat aliases or nested), quietly in the nested form with
    every parameter spelt out (``{policy_loss: {name: clip, ratio_c: null, delta: null}, ...}``), so configs
    saved before and after compare equal. Values that do not resolve are left as they are."""
    out = {k: v for k, v in values.items() if k not in FLAT_ALIASES}
    for old, value in values.items():
        if old in FLAT_ALIASES:
            put_alias(out, old, value, quiet=True)
    for key in REGISTRIES.keys() & out.keys():
        try:
            out[key] = resolve(f"algorithm.{key}", out[key], REGISTRIES[key], DEFAULT_ENTRY[key]).as_dict()
        except (ConfigError, TypeError):
            pass
    return out


def nested_saved(tree: dict[str, Any]) -> dict[str, Any]:
    """A saved nested config (config.yaml, a checkpoint's trainer state) with its `algorithm` section in the nested
    form (:func:`nested_algorithm`), quietly; other sections as they are."""
    algorithm = tree.get("algorithm")
    return {**tree, "algorithm": nested_algorithm(algorithm)} if isinstance(algorithm, dict) else tree
