"""Tests for cold-start SFT: label masking, a micro training run, evaluation helpers, CLI."""

import math

import pytest
import torch

from grpo.training.evaluate import generate_texts

from grpo.training import sft
from grpo.modeling.models import build_model, build_tokenizer, load_policy
from grpo.data.tasks import arithmetic as A


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(autouse=True)
def one_thread():
    """Micro models are overhead-bound: one intra-op thread is faster and immune to CPU contention."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_build_batch_masks_prompt_and_padding(tokenizer):
    prompts = ["1+2+3=", "10+20-5="]
    completions = ["<think></think><answer>6</answer>", "<think>10+20=30,30-5=25</think><answer>25</answer>"]
    batch = sft.build_batch(tokenizer, prompts, completions)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == mask.shape == labels.shape
    for row, (p, c) in enumerate(zip(prompts, completions)):
        n_p = len(p)  # character-level: one token per character
        n_c = len(tokenizer(c, add_special_tokens=False)["input_ids"]) + 1  # + eos
        assert labels[row, :n_p].tolist() == [sft.IGNORE_INDEX] * n_p
        assert labels[row, n_p : n_p + n_c].tolist() == ids[row, n_p : n_p + n_c].tolist()
        assert ids[row, n_p + n_c - 1].item() == tokenizer.eos_token_id
        assert mask[row].sum().item() == n_p + n_c
        # right padding: padding is masked out and ignored by the loss
        assert (labels[row, n_p + n_c :] == sft.IGNORE_INDEX).all()
        assert (ids[row, n_p + n_c :] == tokenizer.pad_token_id).all()
        assert tokenizer.decode(ids[row, n_p : n_p + n_c - 1]) == c
    no_eos = sft.build_batch(tokenizer, prompts[:1], completions[:1], add_eos=False)
    assert no_eos["input_ids"].shape[1] == len(prompts[0]) + len(tokenizer(completions[0])["input_ids"])


def test_loss_ignores_prompt_tokens(tokenizer):
    model = build_model(tokenizer, "micro", seed=0)
    batch = sft.build_batch(tokenizer, ["1+2+3="], ["<think></think><answer>6</answer>"])
    base = sft.completion_loss(model, batch)
    altered = dict(batch)
    labels = batch["labels"].clone()
    labels[0, :5] = batch["input_ids"][0, :5]  # unmask some prompt tokens -> loss changes
    altered["labels"] = labels
    assert not torch.isclose(base, sft.completion_loss(model, altered))
    # Changing the prompt's labels back to ignored gives the same loss as the masked batch.
    assert torch.isclose(base, sft.completion_loss(model, batch))


def test_bucketed_step_matches_full_batch(tokenizer):
    rows = A.sft_examples(24, seed=1, worked_fraction=0.5)
    prompts, completions = [r["prompt"] for r in rows], [r["completion"] for r in rows]
    assert len(sft.length_buckets([len(p + c) for p, c in zip(prompts, completions)])) > 1
    model = build_model(tokenizer, "micro", seed=0)
    full = sft.completion_loss(model, sft.build_batch(tokenizer, prompts, completions))
    full.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    value = sft.sft_step_loss(model, tokenizer, prompts, completions)
    assert value == pytest.approx(full.item(), rel=1e-5)
    for want, p in zip(expected, model.parameters()):
        assert torch.allclose(p.grad, want, atol=1e-6)


def test_lr_schedule():
    f = sft.lr_lambda(10, 100, min_ratio=0.1)          # the trainer's warmup: (step + 1) / (W + 1)
    assert f(0) == pytest.approx(1 / 11)
    assert f(9) == pytest.approx(10 / 11)
    assert f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.55)
    assert f(100) == pytest.approx(0.1)


def test_micro_sft_smoke(tokenizer, tmp_path):
    torch.manual_seed(123)
    initial = build_model(tokenizer, "micro", seed=0)
    lines = []
    stats = sft.run_sft(
        tmp_path / "out", steps=40, batch_size=16, lr=1e-2, worked_fraction=0.5, seed=0, size="micro",
        num_examples=500, log_every=10, log=lines.append,
    )
    assert stats["steps"] == 40 and stats["wall_seconds"] > 0
    assert stats["final_loss"] < 0.7 * stats["first_loss"]
    assert any("step    40/40" in line for line in lines)
    model, tok = load_policy(tmp_path / "out")
    changed = [not torch.equal(a, b) for a, b in zip(initial.state_dict().values(), model.state_dict().values())]
    assert all(changed)
    # Deterministic given the seed.
    again = sft.run_sft(
        tmp_path / "again", steps=40, batch_size=16, lr=1e-2, worked_fraction=0.5, seed=0, size="micro",
        num_examples=500, log_every=10, log=lambda _: None,
    )
    assert again["final_loss"] == pytest.approx(stats["final_loss"], rel=1e-5)
    # The helpers run end to end on the trained micro model.
    rows = A.generate("test", 8, seed=0)
    greedy = sft.evaluate_greedy(model, tok, rows, batch_size=4, max_new_tokens=12)
    assert greedy["n"] == 8 and 0.0 <= greedy["accuracy"] <= 1.0
    sampled = sft.evaluate_sampled(model, tok, rows, num_samples=2, max_new_tokens=12, seed=0)
    assert sampled["n"] == 16 and 0.0 <= sampled["pass_at_k"] <= 1.0
    first = generate_texts(model, tok, rows, temperature=1.0, max_new_tokens=12, seed=5, num_samples=2)
    assert first == generate_texts(model, tok, rows, temperature=1.0, max_new_tokens=12, seed=5, num_samples=2)


def test_score_completions():
    completions = [
        "<think>1+2=3,3+4=7</think><answer>7</answer>",
        "<think>1+2=3,3+4=8</think><answer>8</answer>",
        "<think></think><answer>7</answer>",
        "<answer>7</answer>",
    ]
    stats = sft.score_completions(completions, ["7"] * 4)
    assert stats["n"] == 4
    assert stats["accuracy"] == pytest.approx(0.75)
    assert stats["format"] == pytest.approx(0.75)
    assert stats["worked_share"] == pytest.approx(0.5)
    assert stats["worked_accuracy"] == pytest.approx(0.5)
    assert stats["direct_accuracy"] == pytest.approx(1.0)
    assert math.isnan(sft.score_completions(completions[2:3], ["7"])["worked_accuracy"])


def test_sft_evaluation_is_the_shared_evaluator(tokenizer):
    """SFT's metrics come from grpo.training.evaluate (the decoding `grpo eval` and training use): its
    greedy accuracy equals evaluate()'s accuracy reward on the same rows, batch size aside."""
    from grpo.data.tasks import arithmetic
    from grpo.rewards import load_reward
    from grpo.training.evaluate import evaluate

    model = build_model(tokenizer, "micro", seed=0)
    rows = arithmetic.generate("test", 6, seed=1)
    out = generate_texts(model, tokenizer, rows, max_new_tokens=5, batch_size=4)
    assert len(out) == 6 and out[:1] == generate_texts(model, tokenizer, rows[:1], max_new_tokens=5)
    greedy = sft.evaluate_greedy(model, tokenizer, rows, batch_size=4, max_new_tokens=5)
    shared = evaluate(model, tokenizer, rows, [load_reward("accuracy"), load_reward("format")], max_new_tokens=5)
    assert (greedy["accuracy"], greedy["format"]) == (shared["accuracy"], shared["format"])


def test_cli(tmp_path, capsys):
    from grpo.cli.sft import cold_start_main

    with pytest.raises(SystemExit) as exc:
        cold_start_main(["--help"])
    assert exc.value.code == 0
    assert "--worked-fraction" in capsys.readouterr().out
    code = cold_start_main(["--out", str(tmp_path / "cli"), "--steps", "3", "--batch-size", "4", "--size", "micro",
                            "--num-examples", "50", "--log-every", "1", "--eval-n", "4", "--eval-samples", "1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "greedy" in out and "sampled" in out
    assert (tmp_path / "cli" / "model.safetensors").is_file()
