"""`log.report_to`: TensorBoard, W&B (offline) and trackio receive every step's scalars, read back
through each tracker's own reader and compared with metrics.jsonl."""

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.cli.main import main
from grpo.config import Config, ConfigError, LogConfig, TrainConfig, build_config, field_help
from grpo.state.metrics import read_metrics
from grpo.state.tracking import TRACKERS, open_trackers, tracker_names, tracker_scalars
from tests.run_helpers import cli_argv, make_micro_dir, make_reward, run_in_process, run_subprocess, tiny_config


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracking")
    return make_micro_dir(root / "micro"), make_reward(root)


@pytest.fixture(scope="module")
def never(tmp_path_factory) -> str:
    """A reward that applies to no sample: its mean is NaN every step (null in metrics.jsonl)."""
    path = tmp_path_factory.mktemp("never") / "never_reward.py"
    path.write_text("def never(prompts, completions, **kw):\n    return [None] * len(completions)\n")
    return f"{path}:never"


def expected_scalars(record: dict) -> dict[str, float]:
    """What a tracker should hold for one metrics.jsonl record: every number, null read as NaN."""
    return {k: float("nan") if v is None else float(v) for k, v in record.items()
            if k != "step" and (v is None or isinstance(v, (int, float)))}


def assert_same_value(got: float, want: float, key: str, step: int) -> None:
    """Equal to float32 precision (TensorBoard stores float32), or both NaN."""
    if math.isnan(want):
        assert math.isnan(got), f"{key} at step {step}: {got} != NaN"
    else:
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6), f"{key} at step {step}: {got} != {want}"


def assert_matches_metrics(history: dict[int, dict[str, float]], metrics: list[dict]) -> None:
    """`history` (step -> {key: value}) holds exactly the scalars of every metrics.jsonl record."""
    assert sorted(history) == [r["step"] for r in metrics]
    for record in metrics:
        want, got = expected_scalars(record), history[record["step"]]
        assert set(got) == set(want)
        for key, value in want.items():
            assert_same_value(got[key], value, key, record["step"])


def tensorboard_history(log_dir: Path) -> dict[int, dict[str, float]]:
    """step -> {tag: value} read with TensorBoard's own event reader (it applies purge_step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})   # 0 = keep every event
    acc.Reload()
    history: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        assert len({e.step for e in events}) == len(events), f"{tag}: a step logged twice"
        for event in events:
            history.setdefault(event.step, {})[tag] = event.value
    return history


# --- config -----------------------------------------------------------------------------------------


def test_report_to_takes_a_name_a_list_or_none():
    assert build_config(overrides={"log.report_to": "tensorboard"}).log.report_to == ["tensorboard"]
    cfg = build_config({"log": {"report_to": ["tensorboard", "tensorboard"], "project": "p", "run_name": "r"}})
    assert (tracker_names(cfg.log.report_to), cfg.log.project, cfg.log.run_name) == (["tensorboard"], "p", "r")
    assert tracker_names(build_config(overrides={"log.report_to": "none"}).log.report_to) == []
    assert Config().log.report_to == [] and Config().log.project == "grpo" and Config().log.run_name == ""


@pytest.mark.parametrize("value, message", [
    ("all", "log.report_to: unknown tracker 'all'; valid names: none, tensorboard, wandb, trackio"),
    (["tensorboard", "mlflow"], "log.report_to: unknown tracker 'mlflow'; valid names: none, tensorboard, wandb, trackio"),
    (["none", "tensorboard"], "log.report_to: none cannot be combined with tracker names"),
])
def test_report_to_rejects_unknown_names_in_one_line(value, message):
    with pytest.raises(ConfigError) as e:
        build_config(overrides={"log.report_to": value})
    assert str(e.value) == message


def test_log_keys_carry_help_text():
    helps = {key: text for key, _, text in field_help()}
    assert "tensorboard" in helps["log.report_to"] and "wandb" in helps["log.report_to"]
    assert "project" in helps["log.project"] and "output_dir" in helps["log.run_name"]


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_missing_package_names_the_extra_before_anything_is_written(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, TRACKERS[name].package, None)       # as if it were not installed
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        build_config(overrides={"log.report_to": [name], "train.output_dir": str(out)})
    hint = f'pip install -e ".[{name}]"'
    assert str(e.value).startswith(f"log.report_to: {name} needs the {TRACKERS[name].package} package: {hint}")
    assert "\n" not in str(e.value)
    assert main(["train", f"--log.report_to={name}", f"--train.output_dir={out}"]) == 2     # the CLI: exit 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and hint in err[0]
    assert not out.exists()


def test_unvalidated_config_gets_the_same_hint_when_the_tracker_opens(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = Config(train=TrainConfig(output_dir=str(tmp_path / "run")), log=LogConfig(report_to=["wandb"]))
    with pytest.raises(ConfigError, match=r'log.report_to: wandb needs the wandb package: pip install -e "\.\[wandb\]"'):
        open_trackers(cfg, first_step=1)


def test_tracker_scalars_are_the_numbers_of_a_record():
    record = {"step": 3, "loss/total": 0.25, "data/dropped_prompts": 2, "kl/mean": float("nan"), "note": "x",
              "reward/x/mean": None, "flag": True, "optim/grad_norm": float("inf")}
    got = tracker_scalars(record)
    assert list(got) == ["loss/total", "data/dropped_prompts", "kl/mean"]       # step is the x-axis, not a scalar
    assert got["loss/total"] == 0.25 and got["data/dropped_prompts"] == 2.0 and math.isnan(got["kl/mean"])
    assert isinstance(got["data/dropped_prompts"], float)


# --- TensorBoard ------------------------------------------------------------------------------------


def test_tensorboard_holds_every_step_of_metrics_jsonl(env, never, tmp_path):
    out = tmp_path / "run"
    run_in_process(tiny_config(*env, out, **{"train.max_steps": 2, "log.report_to": ["tensorboard"],
                                              "reward.functions": [env[1], never]}))
    metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2] and metrics[0]["reward/never/mean"] is None   # NaN: sent as NaN
    assert_matches_metrics(tensorboard_history(out / "tensorboard"), metrics)
    assert "loss/total" in metrics[0] and "reward/digits/mean" in metrics[0]


def test_resumed_run_replaces_the_tensorboard_steps_after_its_checkpoint(env, tmp_path):
    out = tmp_path / "run"
    flat = tiny_config(*env, out, **{"train.max_steps": 4, "train.save_steps": 2, "log.report_to": "tensorboard"})
    run_in_process(flat)
    first = read_metrics(out / "metrics.jsonl")
    run_in_process(flat, **{"train.resume": str(out / "checkpoint-2")})   # steps 3 and 4 again
    metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3, 4]
    assert metrics[2]["time/step_s"] != first[2]["time/step_s"]             # the values of the second run
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert_matches_metrics(tensorboard_history(out / "tensorboard"), metrics)


# --- W&B (offline) and trackio ----------------------------------------------------------------------


def read_wandb_records(path: Path) -> list:
    """The protobuf Records of a .wandb transaction log (LevelDB log format after a 7-byte header),
    decoded with wandb's own schema."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, records, pending = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:                                  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:                 # zero padding
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):                            # FULL or LAST: one whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_offline_run(out: Path) -> tuple[dict[int, dict[str, float]], list]:
    """(step -> {key: value} of the history, all records) of the one offline run under OUTPUT_DIR/wandb."""
    (log_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    records = read_wandb_records(log_file)
    history: dict[int, dict[str, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[int(row.pop("_step"))] = {k: v for k, v in row.items() if not k.startswith("_")}
    return history, records


def trackio_logs(project: str, run: str, trackio_dir: Path) -> dict[int, dict[str, float]]:
    """step -> {key: value} of a trackio run, read through trackio's storage API in a fresh process
    (trackio fixes its directory, TRACKIO_DIR, when it is imported)."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs(sys.argv[1], sys.argv[2]), default=str))")
    done = subprocess.run([sys.executable, "-c", code, project, run], env={**os.environ, "TRACKIO_DIR": str(trackio_dir)},
                          capture_output=True, text=True, timeout=120, check=True)
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {int(r["step"]): {k: v for k, v in r.items() if k not in ("step", "timestamp")} for r in rows}


def test_wandb_offline_and_trackio_hold_every_step_of_metrics_jsonl(env, never, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("trackio")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.delenv("TRACKIO_SPACE_ID", raising=False)
    monkeypatch.delenv("TRACKIO_SERVER_URL", raising=False)
    out = tmp_path / "run"
    flat = tiny_config(*env, out, **{"train.max_steps": 2, "log.report_to": ["wandb", "trackio"], "log.project": "t",
                                     "reward.functions": [env[1], never]})
    done = run_subprocess(flat)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = read_metrics(out / "metrics.jsonl")
    assert metrics[1]["reward/never/mean"] is None

    history, records = wandb_offline_run(out)
    assert_matches_metrics(history, metrics)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == ("t", "run")                   # run_name: the output dir's name
    config = {item.key: json.loads(item.value_json) for item in run.config.update}     # the resolved config
    assert config["train"]["max_steps"] == 2 and config["log"]["report_to"] == ["wandb", "trackio"]

    logs = trackio_logs("t", "run", tmp_path / "trackio")
    assert_matches_metrics({step: {k: float(v) for k, v in row.items()} for step, row in logs.items()}, metrics)


def test_the_config_knows_every_tracker_and_its_package():
    """log.report_to is validated in grpo.config.checks: the same names and packages as the writers."""
    from grpo.config.checks import TRACKER_PACKAGES

    assert {name: sink.package for name, sink in TRACKERS.items()} == TRACKER_PACKAGES


def test_a_tracker_failing_to_start_is_one_line_and_leaves_the_run_directory_untouched(env, tmp_path, monkeypatch,
                                                                                       capsys):
    """A tracker that raises when it starts (wandb without a login) is opened before the run's first write: one
    `error:` line naming it, exit 2, and the resumed run's files byte-identical."""
    from tests.state.test_output_dir import snapshot

    class NoLogin:
        package = "json"

        def __init__(self, run):
            raise RuntimeError("No API key configured.\nUse `wandb login` to log in.")

    out = tmp_path / "run"
    flat = tiny_config(*env, out, **{"train.max_steps": 1})
    run_in_process(flat)
    before = snapshot(out)
    monkeypatch.setitem(TRACKERS, "tensorboard", NoLogin)
    capsys.readouterr()
    argv = cli_argv({**flat, "train.max_steps": 2, "train.resume": "auto", "log.report_to": ["tensorboard"]})
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: log.report_to: tensorboard failed to start: RuntimeError: No API key configured."
    assert [line for line in err if line.startswith("error")] == err[-1:]
    assert snapshot(out) == before
