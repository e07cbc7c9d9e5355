import json

import pytest

from grpo.cli.demo_shapes_vqa import run_shapes_vqa_demo
from grpo.data.tasks import shapes_vqa
from grpo.modeling.vlm import build_image_processor, build_vlm, build_vlm_tokenizer, save_vlm

TINY = dict(vision_hidden=32, vision_layers=1, vision_heads=2, text_hidden=32, text_layers=1, text_heads=2,
            text_kv_heads=1)


def test_the_demo_wiring_writes_summary_metrics_and_curves(tmp_path):
    """`grpo demo --task shapes-vqa` end to end on an untrained tiny VLM (2 steps, 8 questions)."""
    tok = build_vlm_tokenizer(shapes_vqa.WORDS)
    model_dir = save_vlm(build_vlm(tok, seed=0, size=TINY), tok, build_image_processor(32), tmp_path / "vlm")
    summary = run_shapes_vqa_demo(tmp_path / "demo", steps=2, eval_problems=8, model_dir=model_dir, train_rows=16,
                                  overrides={"train.prompts_per_step": 2, "rollout.num_generations": 4,
                                             "rollout.max_new_tokens": 6})
    on_disk = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert on_disk["steps"] == 2 and on_disk["eval_problems"] == 8
    assert on_disk["gain"] == pytest.approx(summary["after"]["accuracy"] - summary["before"]["accuracy"])
    assert set(on_disk["before"]["per_type"]) == set(shapes_vqa.QUESTIONS)
    assert len((tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "demo" / "curves.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_shapes_vqa_demo_raises_held_out_accuracy_by_selecting_the_worked_mode(tmp_path):
    """The committed cold start, GRPO shortened (30 steps, 64 questions): greedy decoding starts direct (the
    noisy teacher's guesses, 20-30% right) and GRPO makes it describe the scene first, which is right
    far more often (docs/vlm.md: 100 steps measured +55 points on 256 questions)."""
    s = run_shapes_vqa_demo(tmp_path / "demo", steps=30, eval_problems=64)
    assert s["before"]["worked_share"] < 0.1 and s["before"]["accuracy"] < 0.45, s
    assert s["after"]["worked_share"] > 0.8, s
    assert s["after"]["accuracy"] >= s["before"]["accuracy"] + 0.15, s
    assert (tmp_path / "demo" / "report.html").is_file()


@pytest.mark.slow
def test_grpo_through_the_image_path_learns_a_learnable_reward(tmp_path):
    """The same trainer and image path on the committed VLM learn a reward the policy controls directly:
    "answer red" goes from a few percent of the samples to about half of them in 20 steps (measured 5% -> 58%,
    mean of the first and last three steps, on the previous worked-only cold start; passes on the current one)."""
    import json

    import grpo
    from grpo.cli.demo_shapes_vqa import SHAPES_VQA_MODEL_DIR
    from grpo.modeling.vlm import load_vlm, vision_rows
    from grpo.rewards.text import answer_block

    model, tok, proc = load_vlm(SHAPES_VQA_MODEL_DIR)
    rows = vision_rows(shapes_vqa.generate("train", 400, seed=1), proc, model)
    rows = [{k: r[k] for k in ("prompt", "answer", "pixel_values")} for r in rows]

    def says_red(completions, **kwargs):
        return [float(answer_block(c) == "red") for c in completions]

    cfg = {"max_steps": 20, "num_generations": 8, "learning_rate": 5e-4, "max_completion_length": 24,
           "train.prompts_per_step": 16, "log.progress_bar": False, "cpu.num_threads": 1,
           "train.output_dir": str(tmp_path / "run"), "rollout.temperature": 1.0}
    grpo.Trainer(model, reward_funcs=[says_red], train_dataset=rows, tokenizer=tok, config=cfg).train()
    reward = [json.loads(line)["reward/says_red/mean"] for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert sum(reward[:3]) / 3 < 0.3 and sum(reward[-3:]) / 3 > sum(reward[:3]) / 3 + 0.25, reward
