"""Graceful stop on SIGINT / SIGTERM, and the fault-injection hook used by the kill-and-resume tests.

The first SIGINT or SIGTERM only sets a flag: the trainer finishes the current step, saves a
checkpoint and returns (``grpo train`` then exits with 128 + the signal number: 130 for SIGINT,
143 for SIGTERM, printing the command that resumes the run). A second signal aborts at once:
SIGINT raises ``KeyboardInterrupt`` (exit 130), SIGTERM gets its default action (the process ends).

Test hook: ``GRPO_TEST_KILL_AT="point:step[:SIGNAL],..."`` makes the process send itself a signal
(default SIGKILL) the first time the trainer reaches ``point`` at ``step``. Points: ``rollout``
(experience made, nothing trained yet), ``update`` (after each optimizer update: with mu > 1 the
first one fires between the mu updates), ``step`` (metrics logged, before the checkpoint) and
``save`` (inside the checkpoint write, model files written, state and manifest not yet). Each entry
fires once per run. It exists for tests only; unset, it costs one environment lookup per point.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

KILL_ENV = "GRPO_TEST_KILL_AT"
_fired: set[str] = set()


def _parse_hook(entry: str) -> tuple[str, int, signal.Signals]:
    """'update:3' -> ('update', 3, SIGKILL); 'step:2:TERM' -> ('step', 2, SIGTERM)."""
    parts = entry.strip().split(":")
    name = parts[2].upper() if len(parts) == 3 else "KILL"
    name = name if name.startswith("SIG") else f"SIG{name}"
    if len(parts) not in (2, 3) or not parts[1].isdigit() or name not in signal.Signals.__members__:
        raise ValueError(f"{KILL_ENV}: '{entry}' must be point:step[:SIGNAL], e.g. update:3 or step:2:TERM")
    return parts[0], int(parts[1]), signal.Signals[name]


def fault_point(point: str, step: int) -> None:
    """Test hook: signal this process when GRPO_TEST_KILL_AT names (point, step) (see the module docstring)."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    for entry in spec.split(","):
        where, at, sig = _parse_hook(entry)
        if where == point and at == step and entry not in _fired:
            _fired.add(entry)
            os.kill(os.getpid(), sig)


class GracefulStop:
    """Context manager: the first SIGINT/SIGTERM sets `signal_name`; the second aborts at once.

    Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.signum = 0
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum, self.signal_name = signum, signal.Signals(signum).name
        # a second signal aborts: Ctrl-C raises KeyboardInterrupt, SIGTERM ends the process
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print(f"grpo: {self.signal_name} received: finishing the current step, then saving a checkpoint "
              f"(send it again to abort at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> "GracefulStop":
        _fired.clear()                   # every run (in one process, e.g. tests) gets the test hook afresh
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

