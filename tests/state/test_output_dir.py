"""The output-directory lock: one run per train.output_dir, a stale lock taken over, released on every exit."""

import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from grpo.state import output_dir as guards
from grpo.cli.main import main
from grpo.state.output_dir import LOCK_FILE, LockHolder, OutputDirBusy, OutputDirLock, holder_alive, parse_holder
from tests.run_helpers import ROOT, cli_argv, make_micro_dir, make_reward, records, run_in_process, tiny_config


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("guards")
    return make_micro_dir(root / "micro"), make_reward(root)


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def write_lock(directory, pid: int, host: str | None = None) -> None:
    """A lock file as a run that was SIGKILLed leaves it: its record, no flock."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                                   "started": "2025-01-02 03:04:05"}))


def snapshot(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_the_lock_records_pid_and_host_and_refuses_a_second_holder(tmp_path):
    with OutputDirLock(tmp_path) as lock:
        holder = parse_holder((tmp_path / LOCK_FILE).read_text())
        assert (holder.pid, holder.host) == (os.getpid(), socket.gethostname()) and holder.started
        with pytest.raises(OutputDirBusy) as info:        # a second open file: flock refuses it, even in-process
            OutputDirLock(tmp_path).acquire()
        message = str(info.value)
        assert message == (f"train.output_dir {tmp_path} is in use by another run ({holder.describe()}; "
                           f"{tmp_path / LOCK_FILE}): wait for it to end or choose another train.output_dir")
        assert lock.fd is not None
    assert not (tmp_path / LOCK_FILE).exists()             # released: the file is gone
    with OutputDirLock(tmp_path):                          # and the directory can be taken again
        pass


def test_a_disabled_lock_is_a_no_op(tmp_path):
    with OutputDirLock(tmp_path):
        with OutputDirLock(tmp_path, enabled=False) as other:      # torchrun ranks > 0
            assert other.fd is None


def test_a_concurrent_run_is_refused_with_one_line_and_the_directory_is_untouched(env, tmp_path, capsys):
    out = tmp_path / "run"
    flat = tiny_config(*env, out, **{"train.max_steps": 2})
    run_in_process(flat)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from grpo.state.output_dir import OutputDirLock\n"
                               f"lock = OutputDirLock({str(out)!r}); lock.acquire(); print('held', flush=True)\n"
                               "sys.stdin.read(); lock.release()"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        capsys.readouterr()
        assert main(cli_argv({**flat, "optim.lr": 0.5})) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: train.output_dir {out} is in use by another run "
                                                       f"(pid {holder.pid} on host {socket.gethostname()}, started ")
        assert snapshot(out) == before
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0 and not (out / LOCK_FILE).exists()
    run_in_process({**flat, "train.overwrite_output_dir": True})   # free again


def test_a_stale_lock_of_a_dead_process_is_reported_and_taken_over(env, tmp_path, caplog):
    out = tmp_path / "run"
    pid = dead_pid()
    write_lock(out, pid)
    with caplog.at_level(logging.WARNING):
        result = run_in_process(tiny_config(*env, out, **{"train.max_steps": 1}))
    assert result.steps == 1 and [r["step"] for r in records(out)] == [1]
    warning = next(r.getMessage() for r in caplog.records if "stale lock" in r.getMessage())
    assert warning == (f"warning: train.output_dir {out}: taking over the stale lock of pid {pid} on host "
                       f"{socket.gethostname()}, started 2025-01-02 03:04:05 (that run ended without releasing it)")
    assert not (out / LOCK_FILE).exists()


def test_the_lock_is_released_after_an_error_and_after_a_signal_stop(env, tmp_path, monkeypatch):
    failing = tmp_path / "fails.py"
    failing.write_text("def fails(prompts, completions, **kw):\n    raise ValueError('no')\n")
    out = tmp_path / "run"
    with pytest.raises(Exception, match="no"):
        run_in_process(tiny_config(*env, out, **{"reward.functions": [f"{failing}:fails"]}))
    assert not (out / LOCK_FILE).exists()
    from tests.kill_hook import killing_at

    with killing_at("update:1:TERM"):
        result = run_in_process(tiny_config(*env, out))
    assert result.stopped_by == "SIGTERM" and not (out / LOCK_FILE).exists()


def test_without_flock_the_recorded_pid_decides(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(guards, "_try_flock", lambda fd: None)         # a filesystem without flock
    write_lock(tmp_path, os.getppid())                                  # a live process on this host
    with pytest.raises(OutputDirBusy, match=f"pid {os.getppid()} on host"):
        OutputDirLock(tmp_path).acquire()
    write_lock(tmp_path, os.getpid(), host="elsewhere")                 # another host: cannot be checked
    with pytest.raises(OutputDirBusy, match=f"this filesystem has no flock, so it cannot be checked: delete "
                                            f"{tmp_path / LOCK_FILE} if that run is gone"):
        OutputDirLock(tmp_path).acquire()
    write_lock(tmp_path, dead_pid())
    with caplog.at_level(logging.WARNING), OutputDirLock(tmp_path):
        assert parse_holder((tmp_path / LOCK_FILE).read_text()).pid == os.getpid()
    assert any("taking over the stale lock" in r.getMessage() for r in caplog.records)


def test_holder_alive_and_parse_holder():
    assert holder_alive(LockHolder(os.getpid(), socket.gethostname())) is True
    assert holder_alive(LockHolder(dead_pid(), socket.gethostname())) is False
    assert holder_alive(LockHolder(os.getpid(), "another-host")) is None
    assert parse_holder('{"pid": 7, "host": "h"}') == LockHolder(7, "h", "")
    assert parse_holder("") is None and parse_holder('{"pid": "x"}') is None
