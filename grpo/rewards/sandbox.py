"""Run untrusted Python in a throw-away, resource-limited child process.

``run_sandboxed(code, stdin, timeout, limits)`` writes ``code`` to ``main.py`` in a fresh temporary
directory and runs it with ``sys.executable -I -S -B`` *this file* (the child-side "boot", below),
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

This is defence in depth for reward computation, not a security boundary like a container or a VM:
the file system stays readable, and audit hooks only see Python-level calls of the top process.
"""

from __future__ import annotations

import json
import math
import os
import re
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

SETUP_FAILED = 125          # the child's exit code when it could not confine itself
_MARKER = "GRPO_SANDBOX_RUN"
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


# ----------------------------------------------------------------------------------------- parent side
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
        cfg = {"cwd": workdir, "namespaces": iso.namespaces, "cgroup": cgroup, "limits": limits.__dict__,
               "cpu": limits.cpu_seconds or math.ceil(timeout) + 1, "nproc": _nproc_limit(iso, limits)}
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), json.dumps(cfg)],
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


_STALE_CGROUPS: list[str] = []


def _remove_cgroup(path: str) -> None:
    """rmdir the run's cgroup (killed processes may need a moment to be reaped); retried on later runs."""
    for attempt in range(20):
        for stale in [path] + _STALE_CGROUPS[:]:
            try:
                os.rmdir(stale)
                _STALE_CGROUPS.remove(stale) if stale in _STALE_CGROUPS else None
            except FileNotFoundError:
                _STALE_CGROUPS.remove(stale) if stale in _STALE_CGROUPS else None
            except OSError:
                continue
        if not os.path.exists(path):
            return
        time.sleep(0.01 * (attempt + 1))
    _STALE_CGROUPS.append(path)


def _force_remove(func, path, _exc_info) -> None:
    """rmtree error handler: make the parent writable (the program may have chmod-ed it) and retry."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        func(path)
    except OSError:
        pass


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# ------------------------------------------------------------------------------------------ child side
_CLONE = {"user": 0x10000000, "mount": 0x00020000, "net": 0x40000000, "pid": 0x20000000, "ipc": 0x08000000,
          "uts": 0x04000000}
_MS = {"rdonly": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
       "relatime": 1 << 21, "nosymfollow": 256}
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})
#: audit event -> ((index of a path argument, index of its dir_fd argument or None), ...)
_PATH_EVENTS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
                "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.symlink": ((1, 2),), "os.rename": ((0, 2), (1, 3)),
                "os.link": ((0, 2), (1, 3)), "os.truncate": ((0, None),), "shutil.rmtree": ((0, None),)}
_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/stdout", "/dev/stderr", "/dev/tty"})


def _child_main(cfg: dict) -> None:
    """The boot: confine this process (forking into the pid namespace), then run main.py as __main__."""
    try:
        _confine(cfg)
    except Exception as e:  # noqa: BLE001 - any setup failure must stop the run, never run unconfined
        os.write(2, f"sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        os._exit(SETUP_FAILED)
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    _install_audit_hook(os.path.realpath(os.getcwd()))
    import types

    main = types.ModuleType("__main__")
    main.__file__ = "main.py"
    sys.modules["__main__"], sys.argv = main, ["main.py"]
    exec(compile(source, "main.py", "exec"), main.__dict__)


def _confine(cfg: dict) -> None:
    """Join the cgroup, enter namespaces, set rlimits; in a pid namespace, only the forked child returns."""
    import ctypes
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    if cfg["cgroup"]:
        _write(os.path.join(cfg["cgroup"], "cgroup.procs"), str(os.getpid()))
    if cfg["namespaces"]:
        uid, gid = os.geteuid(), os.getegid()
        _check(libc.unshare(sum(_CLONE.values())), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"1000 {uid} 1")         # not root inside: exec gains no capabilities
        _write("/proc/self/gid_map", f"1000 {gid} 1")
        _mount_readonly(libc, cfg)
    lim = cfg["limits"]
    mb = 1 << 20
    for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cfg["cpu"]),
                       (resource.RLIMIT_AS, lim["memory_mb"] * mb), (resource.RLIMIT_FSIZE, lim["file_size_mb"] * mb),
                       (resource.RLIMIT_NOFILE, lim["open_files"]), (resource.RLIMIT_NPROC, cfg["nproc"])):
        resource.setrlimit(res, (value, value))
    if cfg["namespaces"]:
        pid = os.fork()
        if pid:
            _relay(pid)
        if libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(_MS["nosuid"] | _MS["nodev"] | _MS["noexec"]), None):
            _mount(libc, "tmpfs", "/proc", "tmpfs", _MS["rdonly"], "size=4k")   # hide the host's /proc at least
        _drop_capabilities(libc)
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]


def _mount_readonly(libc, cfg: dict) -> None:
    """Remount every mount read-only in the new mount namespace, and a tmpfs as the working directory."""
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        keep = sum(v for k, v in _MS.items() if k in fields[5].split(","))
        try:
            _mount(libc, None, point, None, _MS_REMOUNT | _MS_BIND | _MS["rdonly"] | keep)
        except OSError:
            if not point.startswith(("/proc", "/sys")):
                raise
    cwd = cfg["cwd"]
    with open(os.path.join(cwd, "main.py"), "rb") as f:
        source = f.read()
    _mount(libc, "tmpfs", cwd, "tmpfs", _MS["nosuid"] | _MS["nodev"],
           f"size={cfg['limits']['file_size_mb']}m,mode=0755,uid=1000,gid=1000")
    os.chdir(cwd)
    with open("main.py", "wb") as f:
        f.write(source)


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    import ctypes

    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _drop_capabilities(libc) -> None:
    """Clear every capability set (the namespaces' root powers are only needed for the mounts)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")


def _check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _relay(pid: int) -> None:
    """The boot outside the pid namespace: wait for its init (the program) and exit the same way."""
    os.close(0)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _install_audit_hook(root: str) -> None:
    """Reject, at the Python level, what the program has no business doing (see the module docstring)."""
    hook = _make_hook(root, os.getpid())
    sys.addaudithook(hook)


def _make_hook(root: str, own_pid: int):
    realpath, join, fspath = os.path.realpath, os.path.join, os.fspath
    getpgid, getpid = os.getpgid, os.getpid
    prefix = root.rstrip("/") + "/"

    def resolve(path, dir_fd=None) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        path = os.fsdecode(fspath(path))
        if dir_fd is not None and not os.path.isabs(path):
            path = join(f"/proc/self/fd/{dir_fd}", path)
        return realpath(path)

    def inside(path) -> bool:
        return path is None or path == root or path.startswith(prefix)

    def deny(event: str, detail="") -> None:
        raise PermissionError(f"sandbox: {event} {detail}".rstrip())

    def pgid_ok(target: int) -> bool:
        try:
            return target in (0, getpid()) or getpgid(target) == getpgid(0)
        except OSError:
            return True           # no such process: the call fails anyway

    def hook(event: str, args: tuple) -> None:
        if event.startswith(("socket.", "ctypes.")) or event in ("gc.get_objects", "gc.get_referrers",
                                                                 "gc.get_referents"):
            deny(event)
        elif event == "import" and args[0].split(".")[0] in _BLOCKED_MODULES:
            deny(event, args[0])
        elif event == "open":
            path, mode, flags = args
            full = resolve(path)
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or bool(
                (flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if full is None:
                return
            if writing and not inside(full) and full not in _DEVICES and not full.startswith("/dev/pts/"):
                deny(event, full)
            proc = re.match(r"/proc/(\d+)(/|$)", full)
            if proc and int(proc.group(1)) not in (own_pid, getpid()):
                deny(event, full)
        elif event in _PATH_EVENTS:
            for i, j in _PATH_EVENTS[event]:
                dir_fd = args[j] if j is not None and j < len(args) and isinstance(args[j], int) else None
                full = resolve(args[i], dir_fd)
                if not inside(full):
                    deny(event, full)
        elif event == "os.kill":
            pid = args[0]
            if pid == -1 or (pid < -1 and -pid != getpgid(0)) or (pid >= 0 and not pgid_ok(pid)):
                deny(event, pid)
        elif event == "os.killpg":
            if args[0] not in (0, getpgid(0)):
                deny(event, args[0])
        elif event == "object.__setattr__" and args[0] is hook:
            deny(event)

    return hook


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
