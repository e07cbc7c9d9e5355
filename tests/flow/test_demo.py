"""`grpo flow demo` at its smallest (1 step, 1 image per prompt): every file is written and the summary
records the run's settings. The slow test (test_demo_slow.py) checks that the demo learns."""

import json

from grpo.cli.main import main


def test_flow_demo_writes_its_summary_and_images_in_one_step(tmp_path):
    out = tmp_path / "demo"
    assert main(["flow", "demo", "--out", str(out), "--steps", "1", "--flow.eval_samples", "1",
                 "--flow.prompts_per_step", "1", "--rollout.num_generations", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1
    assert summary["config"] == {"train.seed": 0, "train.max_steps": 1, "flow.eval_samples": 1,
                                 "flow.prompts_per_step": 1, "rollout.num_generations": 2}
    assert set(summary["before"]) == set(summary["after"]) >= {"compositional", "compositional_main", "gold"}
    for name in ("curves.png", "grid.png", "metrics.jsonl", "config.yaml"):
        assert (out / name).is_file(), name
    assert len(list((out / "grids").glob("*.png"))) == len(summary["held_out_prompts"])
