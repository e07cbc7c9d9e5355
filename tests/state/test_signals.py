"""SIGINT / SIGTERM: finish the step, save, exit 130 / 143 with the resume command; twice: abort."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from grpo.state.checkpoint import list_checkpoints, verify_checkpoint
from grpo.cli.main import main
from tests.kill_hook import killing_at
from tests.run_helpers import (ROOT, assert_same_run, cli_argv, make_micro_dir, make_reward, records, run_in_process,
                               tiny_config)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    return make_micro_dir(root / "micro"), make_reward(root)


@pytest.fixture(scope="module")
def reference(env, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    run_in_process(tiny_config(*env, out))
    return out


def test_sigterm_finishes_the_step_saves_and_the_checkpoint_resumes(env, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    handler = signal.getsignal(signal.SIGTERM)
    with killing_at("rollout:3:TERM"):                              # SIGTERM arrives during step 3
        result = run_in_process(tiny_config(*env, out))
    assert (result.stopped_by, result.signum, result.steps) == ("SIGTERM", 15, 3)
    assert result.checkpoint == out / "checkpoint-3"                # not a save_steps step: saved because of the signal
    verify_checkpoint(result.checkpoint)
    assert [r["step"] for r in records(out)] == [1, 2, 3]          # step 3 was finished, not cut short
    assert "SIGTERM received: finishing the current step" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == handler             # handlers restored
    resumed = run_in_process(tiny_config(*env, out), **{"train.resume": "auto"})
    assert resumed.stopped_by is None and resumed.steps == 6
    assert_same_run(reference, out, 6)


def test_cli_sigint_exits_130_with_the_command_that_resumes(env, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    with killing_at("update:2:INT"):
        assert main(cli_argv(tiny_config(*env, out))) == 130
    err = capsys.readouterr().err
    assert f"grpo: stopped by SIGINT after step 2 of 6; checkpoint: {out / 'checkpoint-2'}" in err
    command = err.split("resume with: ")[1].strip()
    argv = shlex.split(command)
    assert argv[0] == "grpo" and argv[-1] == "--resume" and argv.count("--resume") == 1
    assert main(argv[1:]) == 0
    assert_same_run(reference, out, 6)


def test_a_second_sigint_aborts_at_once(env, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)     # SIG_IGN when the suite runs as a background job
    with killing_at("rollout:3:INT,update:3:INT"):
        assert main(cli_argv(tiny_config(*env, out))) == 130
    assert capsys.readouterr().err.strip().endswith("interrupted")
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-2"]      # no checkpoint of the aborted step
    assert not [p for p in out.iterdir() if p.name.startswith(".checkpoint")]
    assert signal.getsignal(signal.SIGINT) == before                       # handler restored


def test_resume_command_replaces_resume_options():
    from grpo.cli.common import resume_command

    assert resume_command(["train", "--max-steps", "5"]) == "grpo train --max-steps 5 --resume"
    assert resume_command(["train", "--resume", "runs/x/checkpoint-2", "--seed", "1"]) == "grpo train --seed 1 --resume"
    assert resume_command(["train", "--train.resume", "never", "--resume"]) == "grpo train --resume"
    assert (resume_command(["--debug", "train", "--output-dir", "my dir"])
            == "grpo --debug train --output-dir 'my dir' --resume")


@pytest.mark.parametrize("spec", ["update", "update:x", "update:3:NOPE", "nowhere:3"])
def test_kill_hook_rejects_a_malformed_spec(spec):
    with pytest.raises(ValueError, match=f"kill hook: '{spec}' must be point:step"):
        killing_at(spec).__enter__()


def test_kill_hook_fires_once_and_only_at_its_point():
    from grpo.events import emit
    from grpo.state.signals import GracefulStop

    with GracefulStop() as stop, killing_at("step:2:TERM"):
        emit("step", 1)
        emit("update", 2)
        assert not stop.requested
        emit("step", 2)
        assert stop.signal_name == "SIGTERM"
        stop.signal_name = None
        emit("step", 2)                                               # fired once: nothing now
        assert stop.signal_name is None


def test_events_call_listeners_in_order_and_nothing_without_them():
    from grpo import events

    seen = []
    events.emit("rollout", 1)                                         # no listener: nothing happens
    first, second = (lambda p, s: seen.append(("a", p, s))), (lambda p, s: seen.append(("b", p, s)))
    events.add_listener(first)
    events.add_listener(second)
    try:
        events.emit("save", 4)
    finally:
        events.remove_listener(first)
        events.remove_listener(second)
    events.emit("save", 5)
    assert seen == [("a", "save", 4), ("b", "save", 4)]


def _wait_for_lines(path, n, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {n} lines")


@pytest.mark.slow
def test_external_sigterm_to_a_training_process(env, tmp_path):
    """A real SIGTERM from outside, at a moment the test does not choose: exit 143, then the printed
    command resumes to the uninterrupted result; a second SIGTERM ends the process at once."""
    steps = {"train.max_steps": 30, "train.save_steps": 10}
    ref = tmp_path / "ref"
    run_in_process(tiny_config(*env, ref, **steps))
    out = tmp_path / "run"
    child_env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "grpo", *cli_argv(tiny_config(*env, out, **steps))]
    proc = subprocess.Popen(argv, cwd=ROOT, env=child_env, stderr=subprocess.PIPE, text=True)
    _wait_for_lines(out / "metrics.jsonl", 2, proc)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143, err[-2000:]
    stopped = len(records(out))
    assert 2 <= stopped < 30 and (out / f"checkpoint-{stopped}").is_dir()
    command = shlex.split(err.split("resume with: ")[1].strip())
    done = subprocess.run([sys.executable, "-m", "grpo", *command[1:]], cwd=ROOT, env=child_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(ref, out, 30)
    twice = subprocess.run([sys.executable, "-m", "tests.kill_hook", "rollout:3:TERM,update:3:TERM", "--",
                            *cli_argv(tiny_config(*env, tmp_path / "twice", **steps))], cwd=ROOT, env=child_env,
                           capture_output=True, text=True, timeout=300)
    assert twice.returncode == -signal.SIGTERM
    assert json.loads((tmp_path / "twice" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2


HANGS_ON_FIRST_CALL = """\
import os, signal, time

calls = []

def hangs(completions, **kwargs):
    calls.append(1)
    if len(calls) == 1:                      # step 1: SIGTERM arrives while the reward hangs
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(3)                        # the abandoned worker thread ends on its own later
    return [float(len(c)) for c in completions]
"""


def test_sigterm_during_a_hung_reward_still_stops_with_a_checkpoint(env, tmp_path):
    reward = tmp_path / "hang.py"
    reward.write_text(HANGS_ON_FIRST_CALL)
    flat = tiny_config(env[0], f"{reward}:hangs", tmp_path / "run",
                       **{"reward.timeout_s": 0.3, "reward.reward_errors": "zero"})
    t0 = time.perf_counter()
    result = run_in_process(flat)
    assert (result.stopped_by, result.steps, result.checkpoint) == ("SIGTERM", 1, tmp_path / "run" / "checkpoint-1")
    assert time.perf_counter() - t0 < 3                            # the timeout gave control back, not the sleep
    assert records(tmp_path / "run")[0]["reward/hangs/errors"] == 8     # B * G = 2 * 4 completions zeroed


def test_sys_exit_in_a_reward_is_a_one_line_error_not_a_clean_exit(env, tmp_path, capsys):
    reward = tmp_path / "quits.py"
    reward.write_text("import sys\n\ndef quits(completions, **kwargs):\n    sys.exit(0)\n")
    code = main(cli_argv(tiny_config(env[0], f"{reward}:quits", tmp_path / "run")))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: reward function 'quits' raised SystemExit: 0 for completion 0 (")
    assert list_checkpoints(tmp_path / "run") == []
