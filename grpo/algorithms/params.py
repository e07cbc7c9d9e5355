"""How a registry entry declares its own parameters (torchtune-style nested config).

Each registry of this package that has tunable entries carries a ``*_PARAMS`` table beside it: entry name ->
a small frozen dataclass whose fields are that entry's parameters, each with a default and help text::

    @dataclass(frozen=True)
    class SapoParams:
        tau_pos: float = param(1.0, "gate temperature for A > 0")

    POLICY_LOSS_PARAMS = {"clip": ClipParams, "sapo": SapoParams, ...}

The config (grpo/config/variants.py) validates ``algorithm.policy_loss: {name: sapo, tau_pos: 1.2}`` against
``SapoParams`` and hands the instance to the code that calls the entry. An entry without parameters maps to
:class:`NoParams`. A parameter dataclass checks its values in ``__post_init__`` with :func:`require`; the config
reports a failed check as an error naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def param(default: Any, help: str) -> Any:
    """A parameter of a registry entry: its default and one line of help (`grpo train --help-config`)."""
    return field(default=default, metadata={"help": help})


def require(ok: bool, message: str) -> None:
    """A check of a parameter dataclass: ValueError(`message`) unless `ok`."""
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class NoParams:
    """The parameters of an entry that has none."""
