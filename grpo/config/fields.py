"""The field helper of the configuration sections: a dataclass field that carries its help text."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with help text (lists and dicts get a default_factory)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)
