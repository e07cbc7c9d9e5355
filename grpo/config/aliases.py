"""Renamed config keys: an old ``section.key`` spelling keeps working under its new name, with one line on
stderr that gives the new spelling (``grpo: train.x is now cpu.x``), once per process.

A module that renames keys adds them to :data:`RENAMED` (old -> new, both dotted, as a user writes them);
build_config sends every key it reads (YAML, overrides, the Python API's dicts, presets) through
:func:`rename`. :func:`rewrite` does the same to a whole flat dict, :func:`rewrite_tree` to a nested one
(``{section: {key: value}}``, e.g. a saved run's config), ``quiet`` for values the user did not type.
Keys that move into a variant's nested value (``algorithm.sapo_tau_pos`` -> ``algorithm.policy_loss.tau_pos``)
apply only to their registry entry and are handled by grpo/config/variants.py, which prints through
:func:`announce` too.
"""

from __future__ import annotations

import sys
from typing import Any

#: Old dotted key -> its new dotted key.
RENAMED: dict[str, str] = {}
#: The pointers printed so far: each once per process (a config may be built more than once).
PRINTED: set[str] = set()


def pointer(old: str, new: str) -> str:
    """The line printed for a renamed key."""
    return f"grpo: {old} is now {new}"


def announce(old: str, new: str) -> None:
    """Print the pointer from `old` to `new` on stderr, once per process."""
    line = pointer(old, new)
    if line not in PRINTED:
        PRINTED.add(line)
        print(line, file=sys.stderr)


def rename(dotted: str, quiet: bool = False) -> str:
    """The current name of `dotted` (itself when it was not renamed), printing the pointer unless `quiet`."""
    new = RENAMED.get(dotted)
    if new is None:
        return dotted
    if not quiet:
        announce(dotted, new)
    return new


def rewrite(flat: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """A flat ``section.key`` dict with every renamed key under its new name (order kept; a key given under
    both names keeps the value given later)."""
    return {rename(k, quiet): v for k, v in flat.items()}


def rewrite_tree(tree: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """A nested ``{section: {key: value}}`` dict with every renamed ``section.key`` moved to its new place
    (``section.group.key`` targets go into the group's mapping)."""
    out: dict[str, Any] = {}
    for section, values in tree.items():
        if not isinstance(values, dict):
            out[section] = values
            continue
        for key, value in values.items():
            new_section, _, new_key = rename(f"{section}.{key}", quiet).partition(".")
            target = out.setdefault(new_section, {})
            *groups, leaf = new_key.split(".")
            for group in groups:
                target = target.setdefault(group, {})
            target[leaf] = value
    return out
