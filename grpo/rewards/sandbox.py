"""Run untrusted Python in a throw-away, resource-limited child process.

``run_sandboxed(code, stdin, timeout, limits)`` writes ``code`` to ``main.py`` in a fresh temporary
directory and runs it with ``sys.executable -I -S -B`` `_sandbox_boot.py` next to it (the child side),
in a new session, with a scrubbed environment, stdout/stderr captured up to a cap; on timeout, cap
overflow or exit, the whole process group (and every process in the run's pids cgroup) is killed
with SIGKILL and the directory removed. Nothing here uses ``preexec_fn``: the child confines
itself, so runs may be launched from many threads.

Layers, strongest first; ``detect_isolation()`` probes once which ones this machine allows:

* namespaces (``unshare`` user+mount+net+pid+ipc+uts): every mount remounted read-only, a tmpfs
  (``file_size_mb``) as the working directory, only a down loopback for network, a fresh ``/proc``
  (host processes and their environments invisible, none can be signalled), all capabilities
  dropped, no-new-privileges; when the run ends, its pid namespace dies with everything in it;
* a pids cgroup (root only, cgroup v1 ``pids``): caps the number of processes -- root ignores
  RLIMIT_NPROC -- and lists every process of the run for the final kill, even ``setsid`` escapees;
* rlimits: CPU, address space, file size, open files, core 0, processes (RLIMIT_NPROC counts
  per user namespace, so inside one it counts only the run; without one, the user's current count
  plus the limit);
* audit hooks in the child's Python (all modes): no sockets, no ctypes, no writes/removes outside
  the working directory, no reads of other processes' ``/proc`` entries, no signals outside the
  run's process group; without a pid namespace or cgroup, leftover processes are found by an
  environment marker and killed.

Programs see the standard library only (``-S``: no site-packages) and, under namespaces, a read-only
file system apart from their working directory (no ``/dev/shm``: no multiprocessing locks).

This is defence in depth for reward computation, not a security boundary like a container or a VM:
the file system stays readable; audit hooks only see Python-level calls of the top process (other
programs it starts escape them, and a determined program can subvert them); the environment marker
misses descendants started with an emptied environment. Without namespaces, only the hooks stand
between a program and the network, the parent's files and the parent's processes.
"""

from __future__ import annotations

import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

from grpo.rewards._sandbox_boot import _MARKER, SETUP_FAILED, _make_hook, _write  # noqa: F401 (re-exported)

_GRACE = 0.5                # seconds to drain pipes after the program exited
_CGROUP_ROOTS = ("/sys/fs/cgroup/pids",)


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits (each process of the run; processes and output per run)."""

    memory_mb: int = 512                 # RLIMIT_AS
    cpu_seconds: int | None = None       # RLIMIT_CPU; None = ceil(timeout) + 1
    file_size_mb: int = 16               # RLIMIT_FSIZE, and the size of the tmpfs working directory
    max_processes: int = 32              # pids cgroup / RLIMIT_NPROC (threads count too)
    open_files: int = 256                # RLIMIT_NOFILE
    output_bytes: int = 64 * 1024        # cap on captured stdout and on stderr; the run is killed past it


@dataclass(frozen=True)
class Isolation:
    """Which kernel mechanisms a run uses (see ``detect_isolation``)."""

    namespaces: bool = False
    cgroup: str | None = None            # base directory of the per-run pids cgroups

    def describe(self) -> str:
        parts = ["namespaces(user,mount,net,pid,ipc,uts)" if self.namespaces else "no-namespaces"]
        parts += ["pids-cgroup"] if self.cgroup else []
        return "+".join(parts + ["rlimits", "audit-hooks"])


@dataclass
class RunResult:
    """What a run produced; ``ok`` = exited 0 within the time and output limits."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    output_truncated: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_truncated


def run_sandboxed(code: str, stdin: str = "", timeout: float = 5.0, limits: Limits = Limits(),
                  isolation: Isolation | None = None, tmp_root: str | None = None) -> RunResult:
    """Run `code` as a Python program in a sandboxed child; returns within about timeout + 0.5 s."""
    iso = isolation or detect_isolation()
    run_id = secrets.token_hex(8)
    workdir = tempfile.mkdtemp(prefix="grpo-sbx-", dir=tmp_root)
    cgroup = None
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        cgroup = _make_cgroup(iso.cgroup, run_id, limits.max_processes + 2)
        argv = [workdir, str(int(iso.namespaces)), cgroup or "", limits.cpu_seconds or math.ceil(timeout) + 1,
                _nproc_limit(iso, limits), limits.memory_mb, limits.file_size_mb, limits.open_files]
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", _child_script(), *map(str, argv)],
                                cwd=workdir, env=_child_env(workdir, run_id), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        kill = lambda: _kill_run(proc, cgroup, None if (iso.namespaces or cgroup) else run_id)  # noqa: E731
        try:
            out, err, timed_out, truncated = _communicate(proc, stdin.encode(), timeout, limits.output_bytes, kill)
        finally:
            kill()
            proc.wait()
        return RunResult(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                         timed_out, truncated, time.monotonic() - start)
    finally:
        if cgroup:
            _remove_cgroup(cgroup)
        shutil.rmtree(workdir, onerror=_force_remove)


@lru_cache(maxsize=None)
def detect_isolation() -> Isolation:
    """Probe (once per process) the strongest isolation this machine allows: the first candidate
    (namespaces and cgroup, namespaces, cgroup, neither) under which a trivial program runs."""
    cgroup = _cgroup_base()
    candidates = dict.fromkeys([Isolation(True, cgroup), Isolation(True, None), Isolation(False, cgroup)])
    reasons = []
    for iso in candidates:
        probe = run_sandboxed("print('ok')", timeout=20.0, isolation=iso)
        if probe.returncode == 0 and probe.stdout == "ok\n":
            break
        reasons.append(f"{iso.describe()}: {(probe.stderr.strip().splitlines() or ['no output'])[-1]}")
    else:
        iso = Isolation(False, None)
    if reasons:
        import logging

        logging.getLogger(__name__).warning("sandbox: using %s; unavailable: %s", iso.describe(), "; ".join(reasons))
    return iso


_BOOT: dict[str, str] = {}


def _child_script() -> str:
    """This module compiled once (next to it when fresh, else into a private temporary directory):
    Python runs bytecode as a script, which spares every run compiling this file (~15 ms)."""
    import importlib.util
    import py_compile

    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_boot.py")
    if os.path.isfile(_BOOT.get("path", "")) or not source.endswith(".py"):
        return _BOOT.get("path", source)
    cached = importlib.util.cache_from_source(source)
    if os.path.isfile(cached) and os.path.getmtime(cached) >= os.path.getmtime(source):
        _BOOT["path"] = cached
    else:
        private = tempfile.mkdtemp(prefix="grpo-sandbox-boot-")
        _remove_at_exit(private)
        _BOOT["path"] = py_compile.compile(source, cfile=os.path.join(private, "_sandbox_boot.pyc"), doraise=True)
    return _BOOT["path"]


def _remove_at_exit(path: str) -> None:
    """rmtree `path` when this process exits (not when a forked child does)."""
    import atexit

    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))


def _child_env(workdir: str, run_id: str) -> dict[str, str]:
    """A scrubbed environment: nothing of the parent's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir,
            "TMPDIR": workdir, _MARKER: run_id}


def _communicate(proc: subprocess.Popen, data: bytes, timeout: float, cap: int, kill) -> tuple:
    """Feed stdin and read stdout/stderr until EOF, the deadline or the cap; -> (out, err, timed_out, truncated).

    `kill` is called as soon as the program exits (so processes it left behind release the pipes).
    """
    deadline, exited_at, timed_out, truncated = time.monotonic() + timeout, None, False, False
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno() if data else -1
    if data:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    pidfd = _pidfd(proc.pid)
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    try:
        while any(fd in sel.get_map() for fd in bufs):
            now = time.monotonic()
            if exited_at is None and _exited(proc.pid):
                exited_at = now
                kill()
            end = deadline if exited_at is None else min(deadline, exited_at + _GRACE)
            if now >= end:
                timed_out = exited_at is None
                break
            for key, _ in sel.select(min(end - now, 0.05 if pidfd is None else end - now)):
                if key.fd == pidfd:
                    sel.unregister(pidfd)
                elif key.fd == stdin_fd:
                    data = _write_some(sel, proc.stdin, data)
                elif not _read_some(sel, key.fd, bufs[key.fd], cap) and len(bufs[key.fd]) > cap:
                    truncated = True
            if truncated:
                break
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        if not proc.stdin.closed:
            proc.stdin.close()
    out, err = (bytes(b[:cap]) for b in bufs.values())
    return out, err, timed_out, truncated


def _read_some(sel, fd: int, buf: bytearray, cap: int) -> bool:
    """Read what is available into `buf`; False at EOF or once `buf` holds more than `cap` bytes."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return True
    buf += chunk
    if not chunk or len(buf) > cap:
        sel.unregister(fd)
        return False
    return True


def _write_some(sel, pipe, data: bytes) -> bytes:
    """Write a chunk of stdin; closes the pipe when everything is written or the child stopped reading."""
    try:
        data = data[os.write(pipe.fileno(), data[:65536]):]
    except BlockingIOError:
        return data
    except BrokenPipeError:
        data = b""
    if not data:
        sel.unregister(pipe.fileno())
        pipe.close()
    return data


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exited(pid: int) -> bool:
    """Whether the child exited, without reaping it (its pid, the group id, stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_run(proc: subprocess.Popen, cgroup: str | None, marker: str | None) -> None:
    """SIGKILL the run's process group, every process of its cgroup, and (fallback) marked processes."""
    if proc.returncode is None:          # not reaped yet: the group id cannot have been reused
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if cgroup:
        _kill_cgroup(cgroup)
    if marker:
        _kill_marked(f"{_MARKER}={marker}".encode())


def _kill_marked(needle: bytes) -> None:
    """Kill processes whose environment holds `needle` (descendants that left the process group)."""
    for _ in range(5):
        hits = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle + b"\0" in f.read() + b"\0":
                        os.kill(int(pid), signal.SIGKILL)
                        hits += 1
            except OSError:
                continue
        if not hits:
            return


def _nproc_limit(iso: Isolation, limits: Limits) -> int:
    """RLIMIT_NPROC: per user namespace, the run's own count; otherwise the user's tasks + the limit."""
    if iso.namespaces or os.geteuid() == 0:
        return limits.max_processes + 2
    uid, tasks = os.getuid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                tasks += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return tasks + limits.max_processes + 2


def _cgroup_base() -> str | None:
    """A writable pids cgroup directory for per-run cgroups (root, cgroup v1), or None."""
    if os.geteuid() != 0:
        return None
    for root in _CGROUP_ROOTS:
        base = os.path.join(root, "grpo-sandbox")
        try:
            os.makedirs(base, exist_ok=True)
            if os.path.isfile(os.path.join(base, "pids.max")):
                return base
        except OSError:
            continue
    return None


def _make_cgroup(base: str | None, run_id: str, max_pids: int) -> str | None:
    if base is None:
        return None
    path = os.path.join(base, run_id)
    os.mkdir(path)
    _write(os.path.join(path, "pids.max"), str(max_pids))
    return path


def _kill_cgroup(path: str) -> None:
    """Forbid new processes in the cgroup, then SIGKILL its members until none is left."""
    try:
        _write(os.path.join(path, "pids.max"), "0")
    except OSError:
        return
    for _ in range(200):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


def _remove_cgroup(path: str) -> None:
    """rmdir the run's cgroup once its killed processes are reaped (an empty leftover is harmless)."""
    for _ in range(20):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _force_remove(func, path, _exc_info) -> None:
    """rmtree error handler: make the parent writable (the program may have chmod-ed it) and retry."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        func(path)
    except OSError:
        pass
