"""Named progress points of a training step, for whoever wants to watch them.

The loop calls :func:`emit` at fixed points: ``rollout`` (experience made, nothing trained yet),
``update`` (after each optimizer update; with mu > 1 the first fires between the mu updates),
``step`` (metrics logged, before any checkpoint) and ``save`` (inside a checkpoint write: model files
written, state and manifest not yet); ``grpo sample`` emits ``sample`` after each batch of prompts is
written (its step: the prompts done so far). Listeners registered with :func:`add_listener` are called as
``listener(point, step)`` in registration order; with none registered, :func:`emit` does nothing.
"""

from __future__ import annotations

from typing import Callable

Listener = Callable[[str, int], None]
POINTS = ("rollout", "update", "step", "save", "sample")
_listeners: list[Listener] = []


def add_listener(listener: Listener) -> None:
    """Call `listener(point, step)` at every point from now on."""
    _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    """Stop calling `listener` (no error when it was not registered)."""
    if listener in _listeners:
        _listeners.remove(listener)


def emit(point: str, step: int) -> None:
    """The loop reached `point` (one of POINTS) at `step`."""
    for listener in list(_listeners):
        listener(point, step)
