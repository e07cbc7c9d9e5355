"""The output directory of a run: created and checked writable before anything is written, and held
by one run at a time (a lock file, LOCK_FILE, that names its holder)."""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grpo.config.checks import LOCK_FILE   # the config refuses it as a metrics file name

log = logging.getLogger(__name__)


class OutputDirError(OSError):
    """train.output_dir cannot be created or written; one line naming it."""


def prepare_output_dir(path: str | Path) -> Path:
    """Create `path` and check that files can be written there (the probe file is removed again)."""
    out = Path(path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".grpo-write-test-"):
            pass
    except OSError as e:
        raise OutputDirError(f"train.output_dir {out} is not a writable directory ({e.strerror or e})") from None
    return out


#: The lock file a run holds in its output directory (hidden: never taken for a checkpoint).


class OutputDirBusy(OutputDirError):
    """Another run holds train.output_dir; one line naming the directory and the holder's pid and host."""


@dataclass(frozen=True)
class LockHolder:
    """What a lock file says about the run holding it."""

    pid: int
    host: str
    started: str = ""

    def describe(self) -> str:
        """'pid 123 on host node1, started 2025-01-01 12:00:00'."""
        return f"pid {self.pid} on host {self.host}" + (f", started {self.started}" if self.started else "")


def parse_holder(text: str) -> LockHolder | None:
    """The holder recorded in a lock file's text; None when it is empty or unreadable (a torn write)."""
    try:
        data = json.loads(text)
        return LockHolder(int(data["pid"]), str(data["host"]), str(data.get("started", "")))
    except (ValueError, KeyError, TypeError):
        return None


def holder_alive(holder: LockHolder) -> bool | None:
    """Whether the holder's process still runs: True / False on this host, None (unknown) on another."""
    if holder.host != socket.gethostname():
        return None
    try:
        os.kill(holder.pid, 0)                 # signal 0: only asks whether the pid exists
    except ProcessLookupError:
        return False
    except PermissionError:                    # it exists, under another user
        return True
    return True


def _try_flock(fd: int) -> bool | None:
    """An exclusive, non-blocking flock on `fd`: True (held now), False (another holds it), None (the
    filesystem or platform has no flock; then the recorded pid decides)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:                            # ENOLCK, EOPNOTSUPP, ENOSYS: no flock here
        return None
    return True


def _read_fd(fd: int) -> str:
    """The whole (small) content of an open file."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _is_current(fd: int, path: Path) -> bool:
    """True while `path` still names the file open as `fd` (a releasing run unlinks it)."""
    try:
        now, held = path.stat(), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


class OutputDirLock:
    """OUTPUT_DIR/.grpo.lock, held for the whole run so that a second run on the directory is refused.

    The file records the holder's pid, host and start time, and is flock()ed while held: the kernel
    drops a flock when its process dies (SIGKILL, OOM, power loss), so a lock file whose flock is free
    was left by a run that ended without releasing it. Such a stale lock is taken over with a warning.
    Where flock is unavailable, the recorded pid decides (a dead pid on this host is stale; a pid on
    another host cannot be checked and is refused). Released (the file removed) on every exit path.
    `enabled=False` (torchrun ranks other than 0) makes it a no-op.
    """

    def __init__(self, output_dir: str | Path, enabled: bool = True):
        self.dir, self.path, self.enabled = Path(output_dir), Path(output_dir) / LOCK_FILE, enabled
        self.fd: int | None = None

    def __enter__(self) -> "OutputDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock or raise OutputDirBusy naming the holder; warn when taking over a stale one."""
        if not self.enabled or self.fd is not None:
            return
        for _ in range(20):                    # a holder releasing meanwhile unlinks the file: open it anew
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                if self._claim(fd):
                    self.fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise OutputDirBusy(f"train.output_dir {self.dir}: could not take {LOCK_FILE} (it keeps being replaced)")

    def _claim(self, fd: int) -> bool:
        """Hold `fd`'s lock and write this process into it; False when the file was replaced meanwhile."""
        locked = _try_flock(fd)
        previous = parse_holder(_read_fd(fd))
        if not _is_current(fd, self.path):
            return False
        if locked is False:
            raise self._busy(previous)
        if locked is None and previous is not None and holder_alive(previous) is not False:
            raise self._busy(previous, checked=False)
        if previous is not None:
            log.warning("warning: train.output_dir %s: taking over the stale lock of %s (that run ended without "
                        "releasing it)", self.dir, previous.describe())
        me = LockHolder(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": me.pid, "host": me.host, "started": me.started}).encode() + b"\n", 0)
        return True

    def _busy(self, holder: LockHolder | None, checked: bool = True) -> OutputDirBusy:
        """The one-line refusal naming the directory and the holder."""
        who = holder.describe() if holder else "a run that has not recorded its pid yet"
        hint = ("wait for it to end or choose another train.output_dir" if checked else
                f"this filesystem has no flock, so it cannot be checked: delete {self.path} if that run is gone")
        return OutputDirBusy(f"train.output_dir {self.dir} is in use by another run ({who}; {self.path}): {hint}")

    def release(self) -> None:
        """Remove the lock file and drop the flock (unlinked first, so no one takes the old file)."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            if _is_current(fd, self.path):
                self.path.unlink()
        except OSError:
            pass                               # already gone: the next run finds no lock
        finally:
            os.close(fd)
