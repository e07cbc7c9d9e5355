"""One config value checked against its field's type annotation (and converted where the type allows: an
integral float to int, a number to float, a scalar to str, one value to a one-item list); the error names the
key. Building the tree (grpo/config/build.py) and a variant's own parameters (grpo/config/variants.py) use it."""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from grpo.config.errors import ConfigError


def coerce(key: str, value: Any, annotation: Any) -> Any:
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
        return [coerce(key, v, item) for v in value]
    if origin is dict:
        key_type, value_type = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' expects a mapping, got {value!r}")
        return {coerce(key, k, key_type): coerce(key, v, value_type) for k, v in value.items()}
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
