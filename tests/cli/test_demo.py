import json

import pytest

from grpo.cli.demo import run_demo


def test_demo_writes_summary_metrics_and_curves(tmp_path):
    summary = run_demo(tmp_path / "demo", steps=2, eval_problems=16,
                       overrides={"log.progress_bar": False, "train.prompts_per_step": 2})
    on_disk = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert on_disk["steps"] == 2 and on_disk["before"]["accuracy"] == summary["before"]["accuracy"]
    assert set(on_disk) >= {"before", "after", "steps", "wall_s"}
    assert 0.0 <= on_disk["after"]["accuracy"] <= 1.0 and on_disk["wall_s"] > 0
    assert len((tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "demo" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "<img" in (tmp_path / "demo" / "report.html").read_text()              # grpo report, next to summary.json
    assert len((tmp_path / "demo" / "samples.jsonl").read_text().splitlines()) == 2 * 2   # best + worst per step


def test_demo_follows_train_output_dir(tmp_path):
    """`grpo demo --train.output_dir DIR`: the run writes there, so do the demo's summary, curves and report
    (they used to be looked for in the default directory, and the demo failed after training)."""
    run_demo(tmp_path / "unused", steps=1, eval_problems=4, overrides={
        "log.progress_bar": False, "train.prompts_per_step": 2, "train.output_dir": str(tmp_path / "chosen")})
    assert len((tmp_path / "chosen" / "metrics.jsonl").read_text().splitlines()) == 1
    assert all((tmp_path / "chosen" / name).is_file() for name in ("summary.json", "curves.png", "report.html"))
    assert not (tmp_path / "unused").exists()


@pytest.mark.slow
def test_demo_learns(tmp_path):
    """End to end: GRPO raises greedy held-out accuracy by >= 15 points (the demo's promise), and the health
    rules stay silent on it (docs/health.md): no alerts.jsonl line, report.html beside summary.json."""
    summary = run_demo(tmp_path / "demo", overrides={"log.progress_bar": False})
    gain = summary["after"]["accuracy"] - summary["before"]["accuracy"]
    assert gain >= 0.15, summary
    alerts = tmp_path / "demo" / "alerts.jsonl"
    assert not alerts.exists() or alerts.read_text() == "", alerts.read_text()
    assert (tmp_path / "demo" / "report.html").is_file()


@pytest.mark.slow
def test_demo_learns_in_bf16(tmp_path):
    """train.precision bf16 (autocast, float32 master weights) still learns: >= 15 points of held-out
    accuracy after a shortened demo (60 steps, 128 problems, ~30 s; measured +69.5 points)."""
    summary = run_demo(tmp_path / "demo", steps=60, eval_problems=128,
                       overrides={"log.progress_bar": False, "train.precision": "bf16"})
    gain = summary["after"]["accuracy"] - summary["before"]["accuracy"]
    assert gain >= 0.15, summary


@pytest.mark.slow
def test_calculator_demo_learns_to_use_the_tool(tmp_path):
    """grpo demo --task calculator, shortened (40 steps, 64 problems): GRPO raises held-out accuracy above the
    cold start and above the no-tool policy, and the tool-use rate rises (full-size numbers: docs/agents.md)."""
    from grpo.cli.demo_calculator import run_calculator_demo

    s = run_calculator_demo(tmp_path / "calc", steps=40, eval_problems=64, overrides={"log.progress_bar": False})
    assert s["after"]["exact_match"] >= s["before"]["exact_match"] + 0.15, s
    assert s["after"]["tool_use"] > s["before"]["tool_use"], s
    assert s["after_no_tools"]["exact_match"] <= 0.05 and s["after"]["exact_match"] >= 0.6, s
    assert (tmp_path / "calc" / "report.html").is_file() and (tmp_path / "calc" / "curves.png").is_file()


def test_demo_settings_drop_the_algorithm_section_only_for_a_preset():
    from grpo.cli.demo import DEMO_CONFIG, demo_settings

    assert demo_settings() == DEMO_CONFIG and demo_settings()["train"] is not DEMO_CONFIG["train"]
    with_preset = demo_settings({"algorithm.preset": "dapo"})
    assert "algorithm" not in with_preset and with_preset["rollout"] == DEMO_CONFIG["rollout"]
    assert "algorithm" in DEMO_CONFIG                                         # the module's table is untouched


def test_start_demo_clears_old_metrics_and_sets_threads_and_seed(tmp_path):
    """Every demo's first step: the output dir (from --train.output_dir when given), the previous metrics.jsonl
    gone, the base config under the overrides, torch's thread count and seed."""
    import torch

    from grpo.cli.demo import DEMO_CONFIG, start_demo

    target = tmp_path / "given"
    target.mkdir()
    (target / "metrics.jsonl").write_text('{"step": 1}\n')
    threads = torch.get_num_threads()
    try:
        out, cfg = start_demo(DEMO_CONFIG, tmp_path / "default", 7, 3,
                              {"train.output_dir": str(target), "rollout.num_generations": 4})
        first = torch.rand(3)
        torch.manual_seed(7)
        assert torch.equal(first, torch.rand(3))
        assert torch.get_num_threads() == 1 == cfg.cpu.num_threads
    finally:
        torch.set_num_threads(threads)
    assert out == target and not (target / "metrics.jsonl").exists() and not (tmp_path / "default").exists()
    assert cfg.train.max_steps == 3 and cfg.train.seed == 7 and cfg.rollout.num_generations == 4
    assert cfg.rollout.max_new_tokens == DEMO_CONFIG["rollout"]["max_new_tokens"]
