"""`grpo flow demo` with reduced settings (the committed base model, fewer steps): it writes its files and
the held-out compositional reward rises."""

import json

import pytest

from grpo.cli.main import main


@pytest.mark.slow
def test_flow_demo_reduced_gains_on_held_out_prompts(tmp_path):
    out = tmp_path / "demo"
    assert main(["flow", "demo", "--out", str(out), "--steps", "15", "--flow.eval_samples", "6"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 15
    assert summary["after"]["compositional"] >= summary["before"]["compositional"] + 0.05, summary
    for name in ("curves.png", "grid.png", "metrics.jsonl", "config.yaml"):
        assert (out / name).is_file(), name
    assert len(list((out / "grids").glob("*.png"))) == len(summary["held_out_prompts"]) == 12
