"""`grpo flow train`: config flags as `grpo train`, resume, and one-line errors."""

from grpo.cli.main import main
from grpo.state.metrics import read_metrics

TINY = ["--flow.task", "mixture", "--flow.model", "", "--flow.model_dim", "16", "--flow.model_depth", "2",
        "--flow.train_steps", "3", "--flow.prompts_per_step", "2", "--rollout.num_generations", "2",
        "--log.progress_bar", "false", "--train.save_steps", "1"]


def test_flow_train_runs_and_resumes(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["flow", "train", "--output-dir", out, "--max-steps", "1", *TINY]) == 0
    assert "done: 1 steps" in capsys.readouterr().out
    assert main(["flow", "train", "--output-dir", out, "--max-steps", "2", "--resume", *TINY]) == 0
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    assert (tmp_path / "run" / "checkpoint-2" / "model.safetensors").is_file()


def test_flow_train_bad_key_is_one_line(tmp_path, capsys):
    assert main(["flow", "train", "--output-dir", str(tmp_path), "--flow.variant", "nope", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: flow.variant must be one of") and "\n" not in err
