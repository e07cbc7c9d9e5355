"""The sandbox's child side: run as a script (`python -I -S _sandbox_boot.pyc ...`) by grpo.rewards.sandbox.

It confines its own process (namespaces, read-only mounts, rlimits, audit hooks) and then runs the
untrusted program as __main__. Standard library only, and imported by nothing at run time but the
parent's constants: every import here costs every sandboxed run.
"""

from __future__ import annotations

import _signal  # the C module: `signal` imports enum, which costs every run ~10 ms
import os
import sys

SETUP_FAILED = 125          # the child's exit code when it could not confine itself
_MARKER = "GRPO_SANDBOX_RUN"

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


def _child_main(argv: list[str]) -> None:
    """The boot: confine this process (forking into the pid namespace), then run main.py as __main__."""
    cwd, namespaces, cgroup, *numbers = argv
    cfg = dict(zip(("cpu", "nproc", "memory_mb", "file_size_mb", "open_files"), map(int, numbers)),
               cwd=cwd, namespaces=namespaces == "1", cgroup=cgroup)
    try:
        _confine(cfg)
    except Exception as e:  # noqa: BLE001 - any setup failure must stop the run, never run unconfined
        os.write(2, f"sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        os._exit(SETUP_FAILED)
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    sys.addaudithook(_make_hook(os.path.realpath(os.getcwd()), os.getpid()))
    main = type(sys)("__main__")
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
    mb = 1 << 20
    for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cfg["cpu"]),
                       (resource.RLIMIT_AS, cfg["memory_mb"] * mb), (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb),
                       (resource.RLIMIT_NOFILE, cfg["open_files"]), (resource.RLIMIT_NPROC, cfg["nproc"])):
        resource.setrlimit(res, (value, value))
    if cfg["namespaces"]:
        pid = os.fork()
        if pid:
            _relay(pid)
        if libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(_MS["nosuid"] | _MS["nodev"] | _MS["noexec"]), None):
            _mount(libc, "tmpfs", "/proc", "tmpfs", _MS["rdonly"], "size=4k")   # hide the host's /proc at least
        _drop_capabilities(libc)
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(libc.prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]


def _mount_readonly(libc, cfg: dict) -> None:
    """Remount every mount read-only in the new mount namespace, and a tmpfs as the working directory."""
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        point = fields[4]
        for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
            point = point.replace(escaped, char)
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
           f"size={cfg['file_size_mb']}m,mode=0755,uid=1000,gid=1000")
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
        if sig not in (_signal.SIGKILL, _signal.SIGSTOP):
            _signal.signal(sig, _signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _make_hook(root: str, own_pid: int):
    """The audit hook: reject, at the Python level, what a program has no business doing (module docstring)."""
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
            pid = full[6:].split("/", 1)[0] if full.startswith("/proc/") else ""
            if pid.isdigit() and int(pid) not in (own_pid, getpid()):
                deny(event, full)
        elif event in _PATH_EVENTS:
            for i, j in _PATH_EVENTS[event]:
                dir_fd = args[j] if j is not None and isinstance(args[j], int) and args[j] >= 0 else None
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


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
    sys.exit()
