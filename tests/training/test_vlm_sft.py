import torch

from grpo.data.tasks import shapes_vqa
from grpo.modeling.vlm import build_image_processor, build_vlm, build_vlm_tokenizer, vision_rows
from grpo.training.sft import IGNORE_INDEX, build_batch
from grpo.training.vlm_sft import answer, evaluate, run_vlm_sft, vlm_sft_loss

TINY = dict(vision_hidden=32, vision_layers=1, vision_heads=2, text_hidden=32, text_layers=1, text_heads=2,
            text_kv_heads=1)


def test_the_sft_loss_is_the_completion_cross_entropy_computed_directly_in_float64():
    tok = build_vlm_tokenizer(shapes_vqa.WORDS)
    model = build_vlm(tok, seed=0, size=TINY).eval()
    rows = vision_rows(shapes_vqa.generate("train", 3, seed=0), build_image_processor(32), model)
    with torch.no_grad():
        got = vlm_sft_loss(model, tok, rows)
        batch = build_batch(tok, [r["prompt"] for r in rows], [shapes_vqa.demonstration(r) for r in rows])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       pixel_values=torch.stack([r["pixel_values"] for r in rows])).logits.double()
    nll, count = 0.0, 0
    for b in range(len(rows)):
        for t in range(1, batch["input_ids"].shape[1]):
            label = int(batch["labels"][b, t])
            if label != IGNORE_INDEX:                        # completion and eos tokens only
                nll -= float(torch.log_softmax(logits[b, t - 1], -1)[label])
                count += 1
    assert count == sum(len(tok(shapes_vqa.demonstration(r))["input_ids"]) + 1 for r in rows)
    assert abs(float(got) - nll / count) < 1e-5


def test_a_short_sft_lowers_the_loss_and_evaluation_scores_the_rollouts():
    model, tok, proc, log = run_vlm_sft(steps=8, batch_size=8, lr=1e-2, num_examples=64, log_every=1, size=TINY)
    assert len(log) == 8 and log[-1]["loss"] < 0.8 * log[0]["loss"]
    held = vision_rows(shapes_vqa.generate("test", 6, seed=0), proc, model)
    texts = answer(model, tok, held, max_new_tokens=6)
    result = evaluate(model, tok, held, max_new_tokens=6)
    assert result["n"] == 6 and result["accuracy"] == shapes_vqa.accuracy(texts, held)   # greedy: same texts
    assert set(result["per_type"]) == set(shapes_vqa.QUESTIONS)


def test_mode_stats_split_accuracy_between_worked_and_direct_completions():
    from grpo.training.vlm_sft import is_worked, mode_stats
    rows = [{"answer": "2"}, {"answer": "red"}, {"answer": "3"}, {"answer": "circle"}]
    texts = ["<think> red circle top left </think> <answer> 2 </answer>",     # worked, right
             "<think> blue square top right </think> <answer> blue </answer>",  # worked, wrong
             "<think> </think> <answer> 3 </answer>",                       # direct, right
             "<answer> circle </answer>"]                                    # malformed: counted direct, right
    assert [is_worked(t) for t in texts] == [True, True, False, False]
    assert mode_stats(texts, rows) == {"worked_share": 0.5, "worked_accuracy": 0.5, "direct_accuracy": 1.0}
    assert mode_stats(texts[2:], rows[2:])["worked_accuracy"] is None


def test_the_noisy_teacher_guesses_only_direct_demonstrations(monkeypatch):
    """direct_noise=1 with worked_fraction=0.5: every direct demonstration's answer is a guess drawn from its
    type's answers, every worked one keeps the true answer (the loss sees exactly these targets)."""
    import grpo.training.vlm_sft as vlm_sft
    seen = []

    def spy(model, tok, rows, worked):
        seen.extend(zip(rows, worked))
        return vlm_sft_loss(model, tok, rows, worked)
    monkeypatch.setattr(vlm_sft, "vlm_sft_loss", spy)
    run_vlm_sft(steps=2, batch_size=32, lr=1e-3, num_examples=64, size=TINY, worked_fraction=0.5, direct_noise=1.0)
    truth = {r["prompt"] + r["scene"]: r["answer"] for r in vision_rows(
        shapes_vqa.generate("train", 64, seed=0), build_image_processor(32), build_vlm(build_vlm_tokenizer(shapes_vqa.WORDS), size=TINY))}
    worked = [r for r, w in seen if w]
    direct = [r for r, w in seen if not w]
    assert worked and direct and all(r["answer"] == truth[r["prompt"] + r["scene"]] for r in worked)
    assert all(r["answer"] in shapes_vqa.ANSWERS[r["qtype"]] for r in direct)
    assert sum(r["answer"] != truth[r["prompt"] + r["scene"]] for r in direct) >= len(direct) // 3
