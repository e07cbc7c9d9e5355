"""Graceful stop on SIGINT / SIGTERM.

The first SIGINT or SIGTERM only sets a flag: the trainer finishes the current step, saves a
checkpoint and returns (``grpo train`` then exits with 128 + the signal number: 130 for SIGINT,
143 for SIGTERM, printing the command that resumes the run). A second signal aborts at once:
SIGINT raises ``KeyboardInterrupt`` (exit 130), SIGTERM gets its default action (the process ends).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType


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
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

