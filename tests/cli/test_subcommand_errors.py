"""Bad input to grpo eval | sample | sft | reward-model | report | export | pipeline: one line naming the
flag, file, line or key at fault, exit code 2, checked before any work, and nothing already written lost."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from grpo.cli.main import main
from tests.run_helpers import make_micro_dir


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The micro model, a small SFT dataset, labelled samples, and a (fake) GRPO run directory."""
    root = tmp_path_factory.mktemp("sub")
    micro = make_micro_dir(root / "micro")
    sft = root / "sft.jsonl"
    sft.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": f"<answer>{i + 1}</answer>"}) + "\n"
                           for i in range(4)))
    rm = root / "rm.jsonl"
    rm.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": f"<answer>{i + (i % 2)}</answer>",
                                      "answer": str(i)}) + "\n" for i in range(6)))
    rewards = root / "rewards.py"
    rewards.write_text("def raises(text):\n    raise ValueError('boom inside extractor')\n")
    afile = root / "afile"
    afile.write_text("x\n")
    return {"root": root, "micro": micro, "sft": sft, "rm": rm, "rewards": rewards, "afile": afile}


def make_run(directory: Path) -> Path:
    """A GRPO run's output directory: a checkpoint (no 'kind' in its state), metrics and config."""
    (directory / "checkpoint-1").mkdir(parents=True)
    (directory / "checkpoint-1" / "trainer_state.json").write_text(json.dumps({"step": 1}))
    (directory / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/total/mean": 0.5}) + "\n")
    (directory / "config.yaml").write_text("train:\n  max_steps: 1\n")
    (directory / "samples.jsonl").write_text(json.dumps({"step": 1, "group": 0, "kind": "best", "prompt": "1+1=",
                                                                 "completion": "2"}) + "\n")
    return directory


def digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: "), err
    assert "Traceback" not in "\n".join(err)
    for needle in needles:
        assert needle in err[-1], err[-1]
    return err[-1]


# --- A3: grpo eval --out ---------------------------------------------------------------------------------

def test_eval_refuses_an_out_directory_of_a_training_run_before_any_work(world, tmp_path, capsys):
    run = make_run(tmp_path / "run")
    before = digest(run)
    assert main(["eval", "--model", str(world["micro"]), "--out", str(run), "--problems", "2",
                 "--max-new-tokens", "2"]) == 2
    one_line_error(capsys, "--out", str(run), "holds a training run")
    assert digest(run) == before
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / ".grpo.lock").write_text("{}")
    assert main(["eval", "--model", str(world["micro"]), "--out", str(locked), "--problems", "2"]) == 2
    one_line_error(capsys, ".grpo.lock")
    assert sorted(p.name for p in locked.iterdir()) == [".grpo.lock"]


def test_eval_refuses_an_out_under_a_file_before_evaluating(world, capsys, monkeypatch):
    import grpo.training.evaluate as evaluate

    monkeypatch.setattr(evaluate, "evaluate", lambda *a, **k: pytest.fail("evaluated before the check"))
    assert main(["eval", "--model", str(world["micro"]), "--out", str(world["afile"] / "x"), "--problems", "2"]) == 2
    one_line_error(capsys, "--out", "is a file")
    assert main(["eval", "--model", str(world["micro"]), "--out", str(world["afile"]), "--problems", "2"]) == 2
    one_line_error(capsys, "--out", "is a file")


def test_eval_writes_a_new_out_directory(world, tmp_path, capsys):
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(world["micro"]), "--out", str(out), "--problems", "2",
                 "--max-new-tokens", "2"]) == 0
    assert (out / "samples.jsonl").is_file() and (out / "summary.json").is_file()
    assert main(["eval", "--model", str(world["micro"]), "--out", str(out), "--problems", "2",
                 "--max-new-tokens", "2"]) == 0                     # an earlier evaluation's directory: rewritten


# --- B / D: eval and sample flags -----------------------------------------------------------------------

@pytest.mark.parametrize("argv, needles", [
    (["eval", "--task", "bogus"], ["--task", "'bogus'", "arithmetic"]),
    (["eval", "--problems", "2", "--max-new-tokens", "-5"], ["--max-new-tokens", "-5"]),
    (["eval", "--problems", "2", "--max-new-tokens", "0"], ["--max-new-tokens", "0"]),
    (["eval", "--problems", "-3"], ["--problems", "-3"]),
    (["sample", "--task", "bogus", "--out", "OUT"], ["--task", "'bogus'"]),
    (["sample", "--problems", "2", "--max-new-tokens", "-5", "--out", "OUT"], ["--max-new-tokens", "-5"]),
    (["sample", "--problems", "-2", "--out", "OUT"], ["--problems", "-2"]),
    (["sample", "--problems", "2", "--batch-size", "0", "--out", "OUT"], ["--batch-size", "0"]),
])
def test_eval_and_sample_flags_are_checked_first(world, tmp_path, capsys, argv, needles):
    out = tmp_path / "s.jsonl"
    argv = [str(out) if a == "OUT" else a for a in argv] + ["--model", str(world["micro"])]
    assert main(argv) == 2
    one_line_error(capsys, *needles)
    assert not out.exists()                                      # no empty --out file left behind


def test_train_with_an_unknown_task_names_data_task(tmp_path, capsys):
    assert main(["train", "--data.task", "bogus", "--output-dir", str(tmp_path / "r")]) == 2
    one_line_error(capsys, "data.task", "'bogus'", "arithmetic")


def test_eval_names_a_failing_answer_extractor(world, capsys):
    spec = f"{world['rewards']}:raises"
    assert main(["eval", "--model", str(world["micro"]), "--problems", "2", "--max-new-tokens", "2", "--maj",
                 "--answer-extractor", spec]) == 2
    one_line_error(capsys, "--answer-extractor", spec, "boom inside extractor")


# --- A8: grpo sample --resume ---------------------------------------------------------------------------

def sample(world, out: Path, *extra: str) -> int:
    return main(["sample", "--model", str(world["micro"]), "--problems", "3", "--num-samples", "2", "--keep", "all",
                 "--max-new-tokens", "2", "--batch-size", "2", "--out", str(out), *extra])


def test_sample_resume_refuses_a_line_it_cannot_read_and_keeps_it(world, tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    assert sample(world, out) == 0
    with out.open("a") as fh:
        fh.write("garbage line\n")
    before = out.read_bytes()
    assert sample(world, out, "--resume") == 2
    one_line_error(capsys, f"{out}:", "--resume")
    assert out.read_bytes() == before


def test_sample_resume_with_other_settings_names_the_flag(world, tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    assert sample(world, out) == 0
    before = out.read_bytes()
    assert sample(world, out, "--resume", "--num-samples", "3") == 2
    one_line_error(capsys, "--num-samples 2 -> 3")
    assert out.read_bytes() == before
    assert sample(world, out, "--resume", "--batch-size", "1") == 0        # the batch size changes no row
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["prompt_index"], r["sample"]) for r in rows) == [(p, s) for p in range(3) for s in range(2)]


# --- A4: grpo sft --output-dir --------------------------------------------------------------------------

def sft(world, out: Path, *extra: str) -> int:
    return main(["sft", "--model", str(world["micro"]), "--dataset", str(world["sft"]), "--output-dir", str(out),
                 "--max-steps", "1", "--train.micro_batch_size", "2", "--log.progress_bar", "false", *extra])


def test_sft_refuses_a_grpo_run_directory(world, tmp_path, capsys):
    run = make_run(tmp_path / "run")
    before = digest(run)
    assert sft(world, run) == 2
    one_line_error(capsys, str(run), "another kind of run")
    assert sft(world, run, "--resume") == 2
    one_line_error(capsys, "another kind of run")
    assert digest(run) == before


def test_sft_refuses_a_directory_a_live_run_holds(world, tmp_path, capsys):
    import socket

    from grpo.state.output_dir import OutputDirLock

    out = tmp_path / "busy"
    out.mkdir()
    with OutputDirLock(out):
        assert sft(world, out) == 2
        one_line_error(capsys, "in use by another run", f"pid {os.getpid()} on host {socket.gethostname()}")
    assert list(out.iterdir()) == []


def test_sft_again_into_its_directory_needs_resume_or_overwrite(world, tmp_path, capsys):
    out = tmp_path / "sft"
    assert sft(world, out) == 0
    before = digest(out)
    assert sft(world, out) == 2
    one_line_error(capsys, "already holds an SFT run", "--resume")
    assert digest(out) == before
    assert sft(world, out, "--max-steps", "2", "--resume") == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert sft(world, out, "--train.overwrite_output_dir", "true") == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]


def test_sft_names_a_non_text_completion(world, tmp_path, capsys):
    data = tmp_path / "int.jsonl"
    data.write_text('{"prompt": "1+1=", "completion": "2"}\n{"prompt": "2+2=", "completion": 4}\n')
    assert main(["sft", "--model", str(world["micro"]), "--dataset", str(data), "--output-dir", str(tmp_path / "o"),
                 "--max-steps", "1"]) == 2
    one_line_error(capsys, str(data), "row 2", "'completion'", "int")


@pytest.mark.parametrize("argv, needle", [
    (["--out", "OUT", "--steps", "0"], "--steps must be >= 1"),
    (["--steps", "1"], "--out"),
    (["--out", "OUT", "--size", "huge"], "--size"),
])
def test_embedded_sft_errors_are_one_line(tmp_path, capsys, argv, needle):
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as stop:
        main(["sft", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not (tmp_path / "o").exists()


def test_embedded_sft_refuses_a_training_run_directory(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    before = digest(run)
    assert main(["sft", "--out", str(run), "--steps", "1", "--size", "micro"]) == 2
    one_line_error(capsys, "--out", "holds a training run")
    assert digest(run) == before


# --- A5 / B / C / D: grpo reward-model ------------------------------------------------------------------

def reward_model(world, out: Path, *extra: str) -> int:
    return main(["reward-model", "--samples", str(world["rm"]), "--label", "accuracy", "--base", str(world["micro"]),
                 "--out", str(out), "--steps", "1", "--batch-size", "2", *extra])


def test_reward_model_refuses_an_existing_file_or_model_directory(world, tmp_path, capsys):
    assert reward_model(world, world["afile"]) == 2
    one_line_error(capsys, "--out", str(world["afile"]), "is a file")
    assert world["afile"].read_text() == "x\n"
    out = tmp_path / "rm"
    assert reward_model(world, out) == 0
    before = digest(out)
    assert reward_model(world, out) == 2
    one_line_error(capsys, "--out", "not empty")
    assert digest(out) == before


@pytest.mark.parametrize("extra, needle", [
    (["--steps", "0"], "--steps must be >= 1"), (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--lr", "-1"], "--lr must be > 0"), (["--held-out", "1.5"], "--held-out must be in [0, 1)"),
    (["--loss", "bogus"], "--loss must be one of pointwise | pairwise"),
])
def test_reward_model_flags_are_checked_before_loading(world, tmp_path, capsys, monkeypatch, extra, needle):
    import grpo.training.reward_model_training as rmt

    monkeypatch.setattr(rmt, "new_reward_model", lambda *a, **k: pytest.fail("loaded a model before the check"))
    assert reward_model(world, tmp_path / "rm", *extra) == 2
    one_line_error(capsys, needle)
    assert not (tmp_path / "rm").exists()


# --- B / C / D: grpo report -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, line, needles", [
    ("metrics.jsonl", "[1, 2]", ["metrics.jsonl:2", "JSON object"]),
    ("metrics.jsonl", '{"loss": 1}', ["metrics.jsonl:2", "'step'"]),
    ("samples.jsonl", '{"step": 1, "kind": "best", "prompt": "p", "completion": "c"}', ["samples.jsonl:2", "'group'"]),
    ("samples.jsonl", "not json", ["samples.jsonl:2", "not valid JSON"]),
])
def test_report_names_the_file_and_line_of_a_bad_record(tmp_path, capsys, name, line, needles):
    run = make_run(tmp_path / "run")
    with (run / name).open("a") as fh:
        fh.write(line + "\n")
    assert main(["report", str(run)]) == 2
    one_line_error(capsys, str(run / name).rsplit(":", 1)[0], *needles)
    assert not (run / "report.html").exists()


def test_report_out_and_sample_steps_errors_name_the_flag(tmp_path, world, capsys):
    run = make_run(tmp_path / "run")
    for out in (world["afile"] / "x.html", tmp_path / "nonexistent_dir" / "x.html"):
        assert main(["report", str(run), "--out", str(out)]) == 2
        msg = one_line_error(capsys, "--out", str(out))
        assert ".tmp" not in msg
    assert main(["report", str(run), "--sample-steps", "999"]) == 2
    one_line_error(capsys, "--sample-steps", "999", "steps with samples: 1")
    assert main(["report", str(run), "--sample-steps", "1"]) == 0
    assert (run / "report.html").is_file()


def test_report_reads_an_eval_out_refused_as_before(world, tmp_path, capsys):
    """A3's end: grpo eval no longer writes its rows into a run, so the run's report still renders."""
    run = make_run(tmp_path / "run")
    assert main(["eval", "--model", str(world["micro"]), "--out", str(run), "--problems", "2"]) == 2
    capsys.readouterr()
    assert main(["report", str(run)]) == 0


# --- B: grpo export / eval of a model directory with truncated weights ----------------------------------

def test_truncated_weights_are_one_line_naming_the_directory(world, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(world["micro"], bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert main(["export", str(bad), str(tmp_path / "e")]) == 2
    one_line_error(capsys, str(bad), "model.safetensors", "unreadable")
    assert not (tmp_path / "e").exists()
    assert main(["eval", "--model", str(bad), "--problems", "1"]) == 2
    one_line_error(capsys, str(bad), "model.safetensors")


# --- A8 / D: grpo pipeline ------------------------------------------------------------------------------

def write_recipe(path: Path, recipe: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.mark.parametrize("recipe, needles", [
    ({"output_dri": "o", "stages": [{"name": "a", "kind": "task_data", "args": {"task": "arithmetic"}}]},
     ["unknown key 'output_dri'", "did you mean 'output_dir'"]),
    ({"stages": [{"name": "a", "kind": "task_data", "argz": {"task": "arithmetic"}}]},
     ["stage 1 'a'", "unknown key 'argz'", "did you mean 'args'"]),
    ({"stages": [{"name": "a", "kind": "task_data", "args": {"task": "arithmetic"}, "extra_field": 1}]},
     ["unknown key 'extra_field'"]),
    ({"stages": [{"name": "a", "kind": "task_data", "args": {"task": "arithmetic", "rows": 2}},
                 {"name": "b", "kind": "merge", "args": {"inputs": ["${a.outptu}"]}}]},
     ["stage 2 'b'", "'${a.outptu}' is not a reference", "${STAGE.output}"]),
    ({"stages": [{"name": "alpha", "kind": "task_data", "args": {"task": "arithmetic", "rows": 2}},
                 {"name": "b", "kind": "merge", "args": {"inputs": ["${alpah.output}"]}}]},
     ["refers to 'alpah'", "did you mean 'alpha'"]),
])
def test_a_bad_recipe_fails_before_any_stage_runs(tmp_path, capsys, recipe, needles):
    out = tmp_path / "o"
    path = write_recipe(tmp_path / "r.yaml", {"output_dir": str(out), **recipe} if "output_dri" not in recipe
                        else recipe)
    assert main(["pipeline", str(path)]) == 2
    one_line_error(capsys, str(path), *needles)
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_pipeline_reruns_a_changed_stage_and_the_ones_after_it(world, tmp_path, capsys):
    out = tmp_path / "o"
    stages = [{"name": "data", "kind": "task_data", "args": {"task": "arithmetic", "rows": 3}},
              {"name": "mix", "kind": "merge", "args": {"inputs": ["${data.output}"]}},
              {"name": "test", "kind": "eval", "args": {"model": str(world["micro"]), "problems": 2,
                                                         "max-new-tokens": 2}}]
    path = write_recipe(tmp_path / "r.yaml", {"output_dir": str(out), "stages": stages})
    assert main(["pipeline", str(path)]) == 0
    assert len((out / "mix" / "merged.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    stages[0]["args"]["rows"] = 5                                         # edit the first stage
    write_recipe(path, {"output_dir": str(out), "stages": stages})
    assert main(["pipeline", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "stage data changed in the recipe" in printed and "done, skipped" not in printed
    assert len((out / "mix" / "merged.jsonl").read_text().splitlines()) == 5
    assert len((out / "mix.replaced-1" / "merged.jsonl").read_text().splitlines()) == 3    # kept, not deleted
    stages[2]["args"]["problems"] = 3                                     # edit only the last stage
    write_recipe(path, {"output_dir": str(out), "stages": stages})
    assert main(["pipeline", str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("done, skipped") == 2 and "stage test changed" in printed
    assert json.loads((out / "test" / "summary.json").read_text())["problems"] == 3
    assert main(["pipeline", str(path)]) == 0
    assert capsys.readouterr().out.count("done, skipped") == 3


def test_sft_max_steps_zero_and_resume_past_the_end(world, tmp_path, capsys):
    out = tmp_path / "sft"
    assert sft(world, out, "--max-steps", "0") == 2
    one_line_error(capsys, "--max-steps", "must be >= 1")
    assert not out.exists()
    assert sft(world, out, "--max-steps", "2") == 0
    before = digest(out)
    assert sft(world, out, "--max-steps", "1", "--resume") == 2
    one_line_error(capsys, "checkpoint-2 is at step 2", "--max-steps")
    assert sft(world, out, "--max-steps", "2", "--resume") == 0
    assert "already at step 2 of 2" in capsys.readouterr().out
    assert digest(out) == before


def test_sample_out_a_directory_or_under_a_file(world, tmp_path, capsys):
    assert sample(world, tmp_path) == 2
    one_line_error(capsys, "--out", str(tmp_path), "is a directory")
    assert sample(world, world["afile"] / "s.jsonl") == 2
    one_line_error(capsys, "--out", "is a file, not a directory")
    assert world["afile"].read_text() == "x\n"


def test_sft_resume_of_a_run_stopped_before_its_first_checkpoint_starts_over(world, tmp_path):
    out = tmp_path / "sft"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss/sft": 9.0}) + "\n")
    assert sft(world, out, "--resume") == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1] and (out / "checkpoint-1").is_dir()
