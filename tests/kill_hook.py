"""The kill-and-resume tests' fault injection: a grpo.events listener that sends this process a signal
the first time the loop reaches a named point at a given step.

    spec = "point:step[:SIGNAL],..."   e.g. "update:3" (SIGKILL) or "rollout:3:TERM,update:3:TERM"

In-process: ``with killing_at("update:2:INT"): ...``. In a child process:
``python -m tests.kill_hook SPEC -- train --config ...`` installs the listener, then runs grpo's CLI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from grpo import events


def parse(spec: str) -> list[tuple[str, int, signal.Signals]]:
    """'update:3,step:2:TERM' -> [('update', 3, SIGKILL), ('step', 2, SIGTERM)]."""
    out = []
    for entry in spec.split(","):
        parts = entry.strip().split(":")
        name = parts[2].upper() if len(parts) == 3 else "KILL"
        name = name if name.startswith("SIG") else f"SIG{name}"
        if (len(parts) not in (2, 3) or parts[0] not in events.POINTS or not parts[1].isdigit()
                or name not in signal.Signals.__members__):
            raise ValueError(f"kill hook: '{entry}' must be point:step[:SIGNAL] with a point of {events.POINTS}")
        out.append((parts[0], int(parts[1]), signal.Signals[name]))
    return out


class KillAt:
    """Listener: signal this process at each (point, step) of `spec`, once each."""

    def __init__(self, spec: str):
        self.entries, self.fired = parse(spec), set()

    def __call__(self, point: str, step: int) -> None:
        for i, (where, at, sig) in enumerate(self.entries):
            if where == point and at == step and i not in self.fired:
                self.fired.add(i)
                os.kill(os.getpid(), sig)


@contextlib.contextmanager
def killing_at(spec: str):
    """The listener of `spec`, registered for the block."""
    listener = KillAt(spec)
    events.add_listener(listener)
    try:
        yield listener
    finally:
        events.remove_listener(listener)


def main(argv: list[str]) -> int:
    spec, sep, *cli = argv
    if sep != "--":
        raise SystemExit("usage: python -m tests.kill_hook SPEC -- <grpo arguments>")
    from grpo.cli.main import main as grpo_main

    events.add_listener(KillAt(spec))
    return grpo_main(cli)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
