"""The sandbox runner, and the hostile-code suite: every attack run through `code_execution` must be
contained -- reward 0, the test process unharmed, back within timeout + 1 s, nothing left running,
nothing written or deleted outside the run's temporary directory, no network, no parent environment."""

import os
import signal
import socket
import sys
import time

import pytest

from grpo.rewards.code import make_code_execution
from grpo.rewards.sandbox import Isolation, Limits, _make_hook, detect_isolation, run_sandboxed

TIMEOUT = 1.0
GOOD = "```python\nprint(input()[::-1])\n```"


def _modes() -> dict[str, Isolation]:
    """The detected isolation and the weaker fallbacks (as on machines without namespaces / cgroups)."""
    detected, modes = detect_isolation(), {}
    for name, iso in [("detected", detect_isolation()), ("no-namespaces", Isolation(False, detected.cgroup)),
                      ("hooks-only", Isolation(False, None))]:
        if iso not in modes.values():
            modes[name] = iso
    return modes


MODES = _modes()


@pytest.fixture(params=list(MODES))
def isolation(request) -> Isolation:
    return MODES[request.param]


def leftovers(marker: str, grace: float = 0.3) -> list[str]:
    """Live (non-zombie) processes whose command line or working directory mentions `marker`."""
    deadline = time.monotonic() + grace
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if int(pid) != os.getpid() and (marker in cmd or marker in cwd):
                found.append(f"{pid}: {cmd[:200]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------ the runner
def test_stdin_stdout_stderr_and_exit_code(tmp_path):
    data = "".join(f"line {i}\n" for i in range(40000))                     # ~ 420 KB through the pipe
    r = run_sandboxed("import sys\ndata = sys.stdin.read()\nprint(len(data), data.count('\\n'))\n"
                      "print('oops', file=sys.stderr)\nsys.exit(3)", stdin=data, timeout=5, tmp_root=str(tmp_path))
    assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.output_truncated) == (3, f"{len(data)} 40000\n",
                                                                                   "oops\n", False, False)
    assert not r.ok and list(tmp_path.iterdir()) == []                      # temp dir removed


def test_timeout_kills_and_returns_promptly(tmp_path):
    start = time.monotonic()
    r = run_sandboxed("import time\ntime.sleep(30)", timeout=TIMEOUT, tmp_root=str(tmp_path))
    assert r.timed_out and r.returncode == -signal.SIGKILL and not r.ok
    assert TIMEOUT <= time.monotonic() - start < TIMEOUT + 1
    assert leftovers(str(tmp_path)) == []


def test_output_cap_truncates_and_kills(tmp_path):
    r = run_sandboxed("while True:\n    print('x' * 1000)", timeout=5, limits=Limits(output_bytes=10_000),
                      tmp_root=str(tmp_path))
    assert r.output_truncated and len(r.stdout) == 10_000 and r.duration < 2 and not r.ok


def test_environment_is_scrubbed_and_cwd_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "hunter2")
    r = run_sandboxed("import os\nprint(sorted(os.environ))\nopen('scratch.txt', 'w').write('ok')\n"
                      "print(open('scratch.txt').read(), os.getcwd() == os.environ['HOME'])",
                      timeout=5, tmp_root=str(tmp_path))
    assert r.stdout == "['GRPO_SANDBOX_RUN', 'HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']\nok True\n"
    assert "hunter2" not in r.stdout + r.stderr and list(tmp_path.iterdir()) == []


def test_cpu_and_file_size_limits(tmp_path):
    r = run_sandboxed("while True:\n    pass", timeout=10, limits=Limits(cpu_seconds=1), tmp_root=str(tmp_path))
    assert not r.timed_out and r.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and r.duration < 3
    r = run_sandboxed("f = open('big', 'wb')\ntry:\n    f.write(b'x' * (8 << 20))\n    f.flush()\n"
                      "except OSError as e:\n    print('limited', e.errno)", timeout=5,
                      limits=Limits(file_size_mb=4), tmp_root=str(tmp_path))
    assert r.stdout.startswith("limited")


def test_isolation_is_detected_once():
    iso = detect_isolation()
    assert detect_isolation() is iso and iso.describe().endswith("rlimits+audit-hooks")


def test_audit_hook_rules(tmp_path):
    hook = _make_hook(str(tmp_path), os.getpid())
    denied = [("os.kill", (-1, 9)), ("os.kill", (1, 9)), ("os.killpg", (1, 9)), ("socket.connect", (None, None)),
              ("import", ("ctypes", None, None, None, None)), ("open", ("/etc/grpo-x", "w", 0)),
              ("open", ("/etc/grpo-x", None, os.O_WRONLY | os.O_CREAT)), ("os.remove", ("/etc/passwd", None)),
              ("os.rename", (str(tmp_path / "a"), "/tmp/b", None, None)), ("open", ("/proc/1/environ", "r", 0)),
              ("gc.get_objects", ())]
    for event, args in denied:
        with pytest.raises(PermissionError):
            hook(event, args)
    for event, args in [("open", (str(tmp_path / "a"), "w", 0)), ("open", ("/etc/hostname", "r", 0)),
                        ("open", ("/dev/null", None, os.O_RDWR)), ("os.kill", (os.getpid(), 0)),
                        ("os.remove", (str(tmp_path / "a"), None)), ("import", ("json", None, None, None, None))]:
        hook(event, args)


# ------------------------------------------------------------------------------------------ hostile suite
PY_ATTACKS = {
    "infinite_loop": "while True:\n    pass",
    "new_session_loop": "import os\nif os.fork() == 0:\n    os.setsid()\nwhile True:\n    pass",  # one leaves the group
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "blocks, size = [], 1 << 20\nwhile True:\n    blocks.append(bytearray(size))\n    size *= 2",
    "print_gigabytes": "import sys\nchunk = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(chunk)",
    "stderr_gigabytes": "import sys\nchunk = 'x' * (1 << 20)\nwhile True:\n    sys.stderr.write(chunk)",
    "fill_disk": "chunk = b'x' * (1 << 20)\nwith open('big', 'wb') as f:\n    for _ in range(10 ** 4):\n"
                 "        f.write(chunk)\nprint('pwned')",
    "write_outside": """
import os, pathlib, shutil
attacks = [lambda: open(CREATED, 'w').write('pwned'), lambda: pathlib.Path(CREATED).write_text('pwned'),
           lambda: os.close(os.open(CREATED, os.O_WRONLY | os.O_CREAT)), lambda: open(SENTINEL, 'a').write('!'),
           lambda: shutil.copyfile('main.py', CREATED), lambda: os.mkdir(CREATED),
           lambda: (os.symlink(SENTINEL, 'link'), open('link', 'w').write('pwned'))]
for attack in attacks:
    try:
        attack()
    except Exception:
        pass
if os.path.exists(CREATED) or open(SENTINEL).read() != 'keep':
    print('pwned')""",
    "delete_files": """
import os, pathlib, shutil
attacks = [lambda: os.remove(SENTINEL), lambda: pathlib.Path(SENTINEL).unlink(), lambda: os.truncate(SENTINEL, 0),
           lambda: os.rename(SENTINEL, SENTINEL + '.moved'), lambda: shutil.rmtree(KEEP_DIR),
           lambda: os.remove(os.path.join(KEEP_DIR, 'file')), lambda: open(SENTINEL, 'w').close(),
           lambda: os.chmod(SENTINEL, 0)]
for attack in attacks:
    try:
        attack()
    except Exception:
        pass
if not os.path.exists(os.path.join(KEEP_DIR, 'file')) or open(SENTINEL).read() != 'keep':
    print('pwned')""",
    "read_parent_env": """
import os
leak = SECRET in str(dict(os.environ))
for path in [f'/proc/{PARENT}/environ', f'/proc/{os.getppid()}/environ', f'/proc/{PARENT}/cmdline']:
    try:
        leak = leak or len(open(path, 'rb').read()) > 0
    except Exception:
        pass
print('pwned' if leak else '')""",
    "network": """
import socket
try:
    s = socket.create_connection(('127.0.0.1', PORT), timeout=0.5)
    s.sendall(b'leak')
    print('pwned')
except Exception:
    pass
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'leak', ('127.0.0.1', PORT))
    print('pwned')
except Exception:
    pass""",
    "kill_parent": """
import os, signal
hits = 0
for attack in [lambda: os.kill(PARENT, signal.SIGKILL), lambda: os.killpg(PARENT_PGID, signal.SIGKILL),
               lambda: os.kill(-PARENT_PGID, signal.SIGKILL), lambda: os.killpg(os.getpgid(PARENT), signal.SIGKILL)]:
    try:
        attack()
        hits += 1
    except Exception:
        pass
print('pwned' if hits else '')
try:
    os.kill(os.getppid(), signal.SIGKILL)
except Exception:
    pass""",
    "sleeping_grandchild": """
import os, subprocess, sys
cmd = [sys.executable, '-c', 'import time; time.sleep(30)  # ' + MARKER]
subprocess.Popen(cmd)
subprocess.Popen(cmd, start_new_session=True)
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, cmd)""",
}

#: The same attacks through other programs, which audit hooks cannot see: namespaces only.
SHELL_ATTACKS = {
    "shell_write_outside": "import subprocess\nsubprocess.run(['sh', '-c', f'echo pwned > {CREATED}; "
                           "echo pwned >> {SENTINEL}; rm -rf {KEEP_DIR}'])",
    "shell_read_parent_env": "import subprocess\nout = subprocess.run(['cat', f'/proc/{PARENT}/environ'], "
                             "capture_output=True).stdout\nprint('pwned' if out else '')",
    "shell_network": "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import socket; "
                     "socket.create_connection((\"127.0.0.1\", %d), timeout=1).sendall(b\"leak\"); "
                     "print(\"pwned\")' % PORT])",
    "shell_kill_parent": "import subprocess\nsubprocess.run(['kill', '-9', str(PARENT)])\n"
                         "subprocess.run(['kill', '-9', '--', f'-{PARENT_PGID}'])",
}


@pytest.fixture
def target(tmp_path, monkeypatch):
    """What the attacks aim at: files outside the run, a listening port, a secret, this process."""
    (tmp_path / "sentinel.txt").write_text("keep")
    (tmp_path / "keep_dir").mkdir()
    (tmp_path / "keep_dir" / "file").write_text("keep")
    (tmp_path / "runs").mkdir()
    monkeypatch.setenv("GRPO_TEST_SECRET", "s3cr3t-" + tmp_path.name)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    yield tmp_path, listener
    listener.close()


def _prelude(tmp_path, listener) -> str:
    consts = dict(SENTINEL=str(tmp_path / "sentinel.txt"), CREATED=str(tmp_path / "created.txt"),
                  KEEP_DIR=str(tmp_path / "keep_dir"), SECRET=os.environ["GRPO_TEST_SECRET"], PARENT=os.getpid(),
                  PARENT_PGID=os.getpgid(0), PORT=listener.getsockname()[1], MARKER=str(tmp_path) + "-grandchild")
    return "".join(f"{k} = {v!r}\n" for k, v in consts.items())


#: Attacks on processes and time: the only ones where a pids cgroup without namespaces changes anything.
PROCESS_ATTACKS = {"infinite_loop", "new_session_loop", "fork_bomb", "sleeping_grandchild"}


@pytest.mark.parametrize("attack", list(PY_ATTACKS) + list(SHELL_ATTACKS))
def test_hostile_code_is_contained(attack, isolation, target):
    tmp_path, listener = target
    if attack in SHELL_ATTACKS and not isolation.namespaces:
        pytest.skip("programs other than Python are only confined by namespaces")
    if attack not in PROCESS_ATTACKS and not isolation.namespaces and isolation.cgroup:
        pytest.skip("same as hooks-only for this attack")
    if attack == "fork_bomb" and not isolation.cgroup and os.geteuid() == 0:
        pytest.skip("root ignores RLIMIT_NPROC: without a pids cgroup only the timeout bounds a fork bomb")
    reward_fn = make_code_execution(timeout=TIMEOUT, workers=2, memory_mb=256, isolation=isolation,
                                    tmp_root=str(tmp_path / "runs"))
    program = _prelude(tmp_path, listener) + (PY_ATTACKS | SHELL_ATTACKS)[attack]
    start = time.monotonic()
    rewards = reward_fn(["p"], [f"```python\n{program}\n```"], tests=[[{"input": "", "output": "pwned"}]])
    elapsed = time.monotonic() - start
    assert rewards == [0.0]
    assert elapsed < TIMEOUT + 1, f"took {elapsed:.2f}s"
    assert leftovers(str(tmp_path)) == []                                   # sandboxes and grandchildren gone
    assert list((tmp_path / "runs").iterdir()) == []                        # temp dirs removed
    assert (tmp_path / "sentinel.txt").read_text() == "keep" and not (tmp_path / "created.txt").exists()
    assert (tmp_path / "keep_dir" / "file").read_text() == "keep"
    with pytest.raises(BlockingIOError):                                    # nobody connected
        listener.accept()
    # the calling process is unharmed and the machinery still works
    assert reward_fn(["p"], [GOOD], tests=[[{"input": "abc", "output": "cba"}]]) == [1.0]


def test_fork_bomb_does_not_exhaust_processes(tmp_path):
    iso = detect_isolation()
    if not iso.cgroup and os.geteuid() == 0:
        pytest.skip("root without a pids cgroup")
    r = run_sandboxed("import os, time\nn = 0\nwhile True:\n    try:\n        if os.fork() == 0:\n"
                      "            time.sleep(30)\n        n += 1\n    except OSError:\n        print(n, flush=True)\n"
                      "        break", timeout=3, tmp_root=str(tmp_path))
    assert r.returncode == 0 and 0 < int(r.stdout) <= Limits().max_processes
    assert leftovers(str(tmp_path)) == []
    assert sys.executable                                                   # still here to assert anything
