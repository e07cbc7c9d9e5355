"""`grpo flow demo` with reduced settings (the committed base model, fewer steps, fewer images): it writes
its files, and on prompts unseen by pre-training and by Flow-GRPO the main object's colour and place
(compositional_main) and the one-object gold metric both rise."""

import json

import pytest

from grpo.cli.main import main


@pytest.mark.slow
def test_flow_demo_reduced_gains_on_held_out_prompts(tmp_path):
    out = tmp_path / "demo"
    assert main(["flow", "demo", "--out", str(out), "--steps", "30", "--flow.eval_samples", "8"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    before, after = summary["before"], summary["after"]
    assert summary["steps"] == 30
    assert after["compositional_main"] >= before["compositional_main"] + 0.15, summary
    assert after["gold"] >= before["gold"] + 0.05, summary                 # not by extra blobs
    for name in ("curves.png", "grid.png", "metrics.jsonl", "config.yaml"):
        assert (out / name).is_file(), name
    assert len(list((out / "grids").glob("*.png"))) == len(summary["held_out_prompts"]) == 6
    assert not set(summary["held_out_prompts"]) & set(summary["training_prompts"])
