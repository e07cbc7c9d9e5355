"""Kill-and-resume: a resumed run ends bit for bit where an uninterrupted one does."""

import errno
import json
import logging
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from grpo.state.checkpoint import CheckpointError, list_checkpoints, verify_checkpoint, write_manifest
from grpo.data.prompts import PromptStream
from grpo.state.metrics import truncate_metrics
from grpo.state.resume import read_checkpoint
from tests.state.test_output_dir import snapshot
from tests.run_helpers import (assert_same_run, cli_argv, make_micro_dir, make_reward, records, run_in_process,
                               run_subprocess, tiny_config)

MU2 = {"algorithm.num_iterations": 2, "algorithm.ref_update_steps": 3}   # mu > 1, a reference that changes


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    return make_micro_dir(root / "micro"), make_reward(root)


@pytest.fixture(scope="module")
def reference_mu2(env, tmp_path_factory):
    """An uninterrupted 6-step run with mu = 2 and reference refresh."""
    out = tmp_path_factory.mktemp("ref") / "run"
    run_in_process(tiny_config(*env, out, **MU2))
    return out


@pytest.fixture(scope="module")
def reference_plain(env, tmp_path_factory):
    """An uninterrupted 6-step run with the tiny defaults (mu = 1)."""
    out = tmp_path_factory.mktemp("ref") / "plain"
    run_in_process(tiny_config(*env, out))
    return out


def test_sigkill_during_the_update_then_resume_is_bit_identical(env, reference_mu2, tmp_path):
    flat = tiny_config(*env, tmp_path / "run", **MU2)
    killed = run_subprocess(flat, kill_at="update:5")         # between the two updates of step 5
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint-2", "checkpoint-4"]
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2, 3, 4]
    # checkpoint-4 carries the reference refreshed at step 3 and the data position
    assert (tmp_path / "run" / "checkpoint-4" / "reference.safetensors").is_file()
    result = run_in_process(flat, **{"train.resume": "auto"})
    assert result.steps == 6 and result.checkpoint == tmp_path / "run" / "checkpoint-6"
    assert_same_run(reference_mu2, tmp_path / "run", 6)


def test_a_checkpoint_holds_no_buffered_rollouts_with_mu_above_one(reference_mu2):
    ckpt = read_checkpoint(reference_mu2 / "checkpoint-4")
    files = {p.name for p in ckpt.path.iterdir()}
    assert not any("batch" in name or "rollout" in name for name in files)
    # all mu = 2 updates of steps 1..4 are done: AdamW has taken 8 steps, the scheduler too
    assert {float(s["step"]) for s in ckpt.optim["optimizer"]["state"].values()} == {8.0}
    assert ckpt.optim["scheduler"]["last_epoch"] == 8
    assert ckpt.trainer_state["step"] == 4 and ckpt.trainer_state["config"]["algorithm"]["num_iterations"] == 2
    assert ckpt.rng["stream"]["num_rows"] == 20 and ckpt.rng["sampler"] is None   # sampling is keyed, no generator
    stream = ckpt.rng["stream"]                   # 4 steps x 2 prompts drawn: the position that keys step 5's sampling
    assert stream["epoch"] * 20 - len(stream["order"]) == 8


def _rewrite_manifest(path):
    write_manifest(path, int(path.name.split("-")[1]))


def _drop_from_manifest(path, name):
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["files"][name]
    (path / "manifest.json").write_text(json.dumps(manifest))


CORRUPTIONS = {
    "bad checksum": (lambda p: (p / "optimizer.pt").write_bytes(b"x" + (p / "optimizer.pt").read_bytes()[1:]),
                     "optimizer.pt does not match its sha256"),
    "missing file": (lambda p: (p / "model.safetensors").unlink(), "missing file model.safetensors"),
    "partial write": (lambda p: (p / "manifest.json").unlink(), "no manifest.json (incomplete write)"),
    "unparsable state": (lambda p: ((p / "trainer_state.json").write_text("{\"step\": "), _rewrite_manifest(p)),
                         "trainer_state.json is unreadable"),
    "torn pickle": (lambda p: ((p / "rng_state.pt").write_bytes((p / "rng_state.pt").read_bytes()[:100]),
                               _rewrite_manifest(p)), "cannot read its state"),
    "partial manifest": (lambda p: _drop_from_manifest(p, "optimizer.pt"), "optimizer.pt is not listed in manifest.json"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_corrupted_latest_checkpoint_falls_back_to_the_previous_one(env, kind, tmp_path, caplog):
    out = tmp_path / "run"
    flat = tiny_config(*env, out)
    run_in_process(flat)
    finished = {k: v.clone() for k, v in _weights(out / "checkpoint-6").items()}
    expected = records(out)
    damage, reason = CORRUPTIONS[kind]
    damage(out / "checkpoint-6")
    with caplog.at_level(logging.WARNING):
        result = run_in_process(flat, **{"train.resume": "auto"})
    warnings = [r.getMessage() for r in caplog.records if "resuming from checkpoint-4" in r.getMessage()]
    assert len(warnings) == 1 and reason in warnings[0] and "\n" not in warnings[0]
    assert "kept as checkpoint-6.invalid" in warnings[0] and (out / "checkpoint-6.invalid").is_dir()
    assert result.checkpoint == out / "checkpoint-6"
    assert all(torch.equal(finished[k], v) for k, v in _weights(out / "checkpoint-6").items())
    assert records(out) == expected


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("raised", ["OSError", "RuntimeError"])
def test_disk_full_while_saving_is_one_line_exit_2_and_the_run_resumes(env, reference_plain, tmp_path, monkeypatch,
                                                                        capsys, raised):
    from grpo.state import checkpoint
    from grpo.cli.main import main

    out = tmp_path / "run"
    flat = tiny_config(*env, out)
    real_save = torch.save

    def save(obj, f, *a, **k):           # the disk fills up halfway through checkpoint-4's optimizer.pt
        real_save(obj, f, *a, **k)
        if "checkpoint-4" in str(f):
            Path(f).write_bytes(Path(f).read_bytes()[:100])
            if raised == "RuntimeError":  # what torch really raises (tests/state/test_checkpoint.py: a real full disk)
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
            raise OSError(errno.ENOSPC, "No space left on device", str(f))

    monkeypatch.setattr(checkpoint, "probe_write", lambda directory: "No space left on device")

    monkeypatch.setattr(torch, "save", save)
    assert main(cli_argv(flat)) == 2
    assert capsys.readouterr().err == (f"error: writing checkpoint {out / 'checkpoint-4'} failed: No space left on "
                                       f"device ({out / '.checkpoint-4.tmp' / 'optimizer.pt'}); earlier checkpoints "
                                       f"are intact\n")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "config.yaml", "metrics.jsonl",
                                                       "samples.jsonl"]
    verify_checkpoint(out / "checkpoint-2")
    monkeypatch.setattr(torch, "save", real_save)
    run_in_process(flat, **{"train.resume": "auto"})
    assert_same_run(reference_plain, out, 6)


def _pages(path: Path) -> int:
    """Bytes a file takes on a tmpfs (whole pages)."""
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    return -(-path.stat().st_size // page) * page


@contextmanager
def small_tmpfs(mount_point: Path, size: int):
    """A tmpfs of `size` bytes at `mount_point`; the test is skipped where mounting is not permitted."""
    import subprocess

    mount_point.mkdir()
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here: a real full filesystem cannot be made")
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip() or proc.returncode}); "
                    "it needs root or CAP_SYS_ADMIN")
    try:
        yield mount_point
    finally:
        busy = subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0
        if busy:
            subprocess.run(["umount", "-l", str(mount_point)])      # detach it anyway
    assert not busy, "a file on the full disk was left open (its space is not freed while it is)"


@pytest.mark.slow
def test_a_real_full_disk_is_one_line_exit_2_and_the_run_resumes(env, reference_plain, tmp_path, capsys):
    """A tmpfs with room for checkpoint-2 and half of checkpoint-4: torch.save hits ENOSPC in optimizer.pt
    (it raises RuntimeError, 'unexpected pos ...'); the run stops with the documented line."""
    from grpo.cli.main import main

    ckpt2, ckpt4 = reference_plain / "checkpoint-2", reference_plain / "checkpoint-4"
    state_files = ("optimizer.pt", "rng_state.pt", "trainer_state.json", "manifest.json")
    size = (sum(_pages(p) for p in ckpt2.iterdir()) + _pages(reference_plain / "config.yaml")
            + _pages(reference_plain / "metrics.jsonl") + 4096                          # metrics, the lock file
            + sum(_pages(p) for p in ckpt4.iterdir() if p.name not in state_files)     # checkpoint-4's model files
            + _pages(ckpt4 / "optimizer.pt") // 2)                                      # and half its optimizer.pt
    with small_tmpfs(tmp_path / "small", size) as disk:
        out = disk / "run"
        capsys.readouterr()
        assert main(cli_argv(tiny_config(*env, out))) == 2
        err = capsys.readouterr().err
        assert err == (f"error: writing checkpoint {out / 'checkpoint-4'} failed: No space left on device "
                       f"({out / '.checkpoint-4.tmp' / 'optimizer.pt'}); earlier checkpoints are intact\n")
        assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "config.yaml", "metrics.jsonl",
                                                       "samples.jsonl"]
        verify_checkpoint(out / "checkpoint-2")
        shutil.copytree(out, tmp_path / "run")                 # continue on a disk with room
    run_in_process(tiny_config(*env, tmp_path / "run"), **{"train.resume": "auto"})
    assert_same_run(reference_plain, tmp_path / "run", 6)


def test_no_valid_checkpoint_is_an_error_and_nothing_is_touched(env, tmp_path):
    from grpo.cli.main import main

    out = tmp_path / "run"
    run_in_process(tiny_config(*env, out, **{"train.max_steps": 2}))
    (out / "checkpoint-2" / "manifest.json").unlink()
    before = (out / "metrics.jsonl").read_bytes()
    code = main(cli_argv(tiny_config(*env, out, **{"train.max_steps": 2}), "--resume"))
    assert code == 2
    assert (out / "metrics.jsonl").read_bytes() == before and (out / "checkpoint-2").is_dir()


def test_resume_from_an_explicit_path_and_after_the_last_step(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_config(*env, a))
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoint-6")
    run_in_process(tiny_config(*env, b), **{"train.resume": str(b / "checkpoint-4")})
    assert_same_run(a, b, 6)
    done = run_in_process(tiny_config(*env, b), **{"train.resume": "auto"})   # already finished: no step
    assert done.steps == 6 and done.checkpoint == b / "checkpoint-6"
    assert_same_run(a, b, 6)
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        run_in_process(tiny_config(*env, b), **{"train.resume": str(b / "checkpoint-5")})


def test_resume_with_a_changed_config_warns(env, tmp_path, caplog):
    out = tmp_path / "run"
    run_in_process(tiny_config(*env, out, **{"train.max_steps": 2}))
    with caplog.at_level(logging.WARNING):
        run_in_process(tiny_config(*env, out, **{"train.max_steps": 3, "optim.lr": 2e-2, "train.resume": "auto"}))
    message = next(r.getMessage() for r in caplog.records if "changed config" in r.getMessage())
    assert "optim.lr: 0.01 -> 0.02" in message and "train.max_steps: 2 -> 3" in message


def test_a_fresh_run_in_a_used_directory_is_refused_unless_overwrite_output_dir(env, tmp_path, caplog, capsys):
    """resume=never in a directory holding a run: one-line error, nothing touched; with
    train.overwrite_output_dir the old checkpoints go (none is left to be resumed into the new run's history)."""
    from grpo.cli.main import main

    out = tmp_path / "run"
    run_in_process(tiny_config(*env, out, **{"train.max_steps": 3}))
    before = snapshot(out)
    capsys.readouterr()
    assert main(cli_argv(tiny_config(*env, out, **{"train.max_steps": 2}))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {out} already holds a run (newest checkpoint: "
                                                    "checkpoint-3): continue it (--resume; Python API: "
                                                    "train(resume_from_checkpoint=True)), start over there "
                                                    "(train.overwrite_output_dir: true; Python API / TRL: "
                                                    "overwrite_output_dir=True)")
    assert snapshot(out) == before
    with caplog.at_level(logging.WARNING):
        run_in_process(tiny_config(*env, out, **{"train.max_steps": 2, "train.overwrite_output_dir": True}))
    assert any("train.overwrite_output_dir: its checkpoints are deleted" in r.getMessage() for r in caplog.records)
    assert [r["step"] for r in records(out)] == [1, 2]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]     # checkpoint-3 is gone
    killed = tmp_path / "killed"                     # resume=auto, killed before its first checkpoint: starts over
    killed.mkdir()
    (killed / "metrics.jsonl").write_text('{"step": 1, "x": 0.5}\n')
    run_in_process(tiny_config(*env, killed, **{"train.max_steps": 1, "train.resume": "auto"}))
    assert [r["step"] for r in records(killed)] == [1] and records(killed)[0].get("x") is None


@pytest.mark.parametrize("resume", ["never", "auto"])
def test_a_run_failing_at_its_first_step_leaves_an_existing_directory_byte_identical(env, tmp_path, resume, capsys):
    from grpo.cli.main import main

    out = tmp_path / "run"
    run_in_process(tiny_config(*env, out, **{"train.max_steps": 4}))
    (out / "checkpoint-4" / "manifest.json").unlink()          # auto would set it aside as checkpoint-4.invalid
    (out / ".checkpoint-6.tmp").mkdir()                         # a leftover the run would clear
    (out / "metrics.jsonl").write_text((out / "metrics.jsonl").read_text() + '{"step": 5, "torn')
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    failing = tmp_path / "fails.py"
    failing.write_text("def fails(prompts, completions, **kw):\n    raise ValueError('reward server down')\n")
    flat = tiny_config(*env, out, **{"train.max_steps": 6, "optim.lr": 0.5, "reward.functions": [f"{failing}:fails"],
                                     "train.resume": resume, "train.overwrite_output_dir": resume == "never"})
    capsys.readouterr()
    assert main(cli_argv(flat)) == 2
    assert "reward server down" in capsys.readouterr().err
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert after == before                                      # config.yaml, metrics.jsonl, checkpoints: as they were
    assert sorted(p.name for p in out.iterdir()) == [".checkpoint-6.tmp", "checkpoint-2", "checkpoint-4", "config.yaml",
                                                     "metrics.jsonl", "samples.jsonl"]


def test_resume_auto_without_a_checkpoint_starts_at_step_zero(env, tmp_path, capsys):
    result = run_in_process(tiny_config(*env, tmp_path / "run", **{"train.max_steps": 1, "train.resume": "auto"}))
    assert result.steps == 1 and "no checkpoint in" in capsys.readouterr().err


def test_lora_resume_is_bit_identical(env, tmp_path):
    lora = {"lora.enabled": True, "lora.r": 4, "lora.dropout": 0.1, "algorithm.num_iterations": 2}
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_config(*env, a, **lora))
    run_in_process(tiny_config(*env, b, **lora, **{"train.max_steps": 4}))
    shutil.rmtree(b / "checkpoint-4")          # as if killed during step 3 or 4
    (b / "metrics.jsonl").write_text((b / "metrics.jsonl").read_text() + '{"step": 5, "torn')
    run_in_process(tiny_config(*env, b, **lora, **{"train.resume": "auto"}))
    assert (b / "checkpoint-6" / "adapter_config.json").is_file()
    assert_same_run(a, b, 6)


def test_truncate_metrics_keeps_steps_up_to_the_checkpoint(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "x"')
    with caplog.at_level(logging.WARNING):
        assert truncate_metrics(path, 2) == 3
    assert [r.getMessage() for r in caplog.records] == [f"warning: {path}: line 5 is not a step record (torn or "
                                                        "edited); dropped"]
    assert path.read_text() == '{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n'
    assert truncate_metrics(path, 2) == 0 and truncate_metrics(tmp_path / "absent.jsonl", 2) == 0
    assert truncate_metrics(path, 0) == 2 and path.read_text() == ""


def test_prompt_stream_state_continues_the_same_order():
    rows = [{"prompt": str(i)} for i in range(5)]
    a = PromptStream(rows, seed=3)
    a.next(7)                                   # into the second epoch
    state = a.state_dict()
    b = PromptStream(rows, seed=99)
    b.load_state_dict(state)
    assert b.epoch == a.epoch == 2 and b.next(9) == a.next(9)
    with pytest.raises(ValueError, match="the prompt set has 4 rows but the checkpoint was written with 5"):
        PromptStream(rows[:4], seed=3).load_state_dict(state)


@pytest.mark.slow
def test_sigkill_at_every_point_in_a_chain_of_resumes(env, reference_mu2, tmp_path):
    """One run killed four times (after the rollout, inside a checkpoint write, between the mu updates,
    after logging a step) and resumed each time in a new process ends like the uninterrupted run."""
    flat = tiny_config(*env, tmp_path / "run", **MU2)
    out = tmp_path / "run"
    for kill_at, survivors in [("rollout:3", ["checkpoint-2"]), ("save:4", ["checkpoint-2"]),
                               ("update:5", ["checkpoint-2", "checkpoint-4"]),
                               ("step:6", ["checkpoint-2", "checkpoint-4"])]:
        proc = run_subprocess(flat, kill_at=kill_at, resume=True)
        assert proc.returncode == -9, (kill_at, proc.stderr[-2000:])
        assert [p.name for p in list_checkpoints(out)] == survivors, kill_at
        if kill_at == "save:4":                # the torn write is hidden, never taken for a checkpoint
            assert (out / ".checkpoint-4.tmp").is_dir()
    proc = run_subprocess(flat, resume=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert_same_run(reference_mu2, out, 6)


@pytest.mark.slow
def test_sigkill_and_resume_with_lora_in_subprocesses(env, tmp_path):
    lora = {"lora.enabled": True, "lora.r": 4, "algorithm.num_iterations": 2}
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_config(*env, a, **lora))
    flat = tiny_config(*env, b, **lora)
    assert run_subprocess(flat, kill_at="update:3").returncode == -9
    proc = run_subprocess(flat, resume=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming from" in proc.stderr and "checkpoint-2" in proc.stderr
    assert_same_run(a, b, 6)


def test_an_lr_change_on_resume_is_applied(env, tmp_path, caplog):
    out = tmp_path / "run"
    run_in_process(tiny_config(*env, out, **{"train.max_steps": 2}))
    with caplog.at_level(logging.WARNING):
        result = run_in_process(tiny_config(*env, out, **{"train.max_steps": 3, "optim.lr": 0.5,
                                                           "train.resume": "auto"}))
    assert [r["optim/lr"] for r in records(out)] == [1e-2, 1e-2, 0.5]      # metrics show the new lr
    message = next(r.getMessage() for r in caplog.records if "changed config" in r.getMessage())
    assert "applied from step 3 on" in message and "optim.lr: 0.01 -> 0.5" in message
    ckpt = read_checkpoint(result.checkpoint)                             # and the scheduler carries it on
    assert ckpt.optim["scheduler"]["base_lrs"] == [0.5] and ckpt.optim["optimizer"]["param_groups"][0]["lr"] == 0.5


def test_a_change_that_cannot_apply_on_resume_is_an_error_naming_the_key(env, tmp_path):
    from grpo.config import ConfigError

    out = tmp_path / "run"
    lora = {"lora.enabled": True, "lora.r": 4, "train.max_steps": 2}
    run_in_process(tiny_config(*env, out, **lora))
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    with pytest.raises(ConfigError, match=r"cannot resume checkpoint-2 with a changed lora.r \(4 -> 8\): the adapter"):
        run_in_process(tiny_config(*env, out, **{**lora, "lora.r": 8, "train.max_steps": 3, "train.resume": "auto"}))
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_resume_given_a_run_directory_names_its_checkpoints(env, tmp_path, capsys):
    from grpo.cli.main import main

    out = tmp_path / "run"
    run_in_process(tiny_config(*env, out, **{"train.max_steps": 1}))
    capsys.readouterr()
    assert main(cli_argv(tiny_config(*env, tmp_path / "other", **{"train.max_steps": 2, "train.resume": str(out)}))) == 2
    assert capsys.readouterr().err == (f"error: train.resume={out} is a run directory, not a checkpoint: pass one of "
                                       f"its checkpoints ({out / 'checkpoint-1'}), or --resume alone for the newest "
                                       "valid one of train.output_dir\n")
