"""grpo/training/reward_model_training.py and `grpo reward-model`."""

import json
import random

import pytest
import torch

from grpo.data.tasks import arithmetic
from grpo.modeling.models import EMBEDDED_MODEL_DIR, load_tokenizer
from grpo.training.reward_model_training import (ReplayBuffer, accuracy, mixed_batch, new_reward_model,
                                                 train_reward_model)


def completion(i: int, answer: str) -> tuple[str, int]:
    """Every other completion well formed (label 1); the others lack the think block or all tags (label 0)."""
    if i % 2 == 0:
        return f"<think></think><answer>{answer}</answer>", 1
    return (f"<answer>{answer}</answer>" if i % 4 == 1 else answer), 0


def labelled(n: int, seed: int):
    """Arithmetic prompts with labelled completions (a format judge: learnable by a tiny reward model)."""
    items = []
    for i, r in enumerate(arithmetic.generate("train", n, seed=seed)):
        text, label = completion(i, r["answer"])
        items.append((r["prompt"] + text, True, label))
    return items


@pytest.mark.parametrize("batch_size,replay,expected", [(10, 0.1, 1), (16, 0.1, 2), (32, 0.1, 3), (8, 0.0, 0)])
def test_replay_is_its_share_of_every_batch(batch_size, replay, expected):
    """round(replay x B) history items per batch (10% of 16 = 1.6 -> 2), the rest new; none without history."""
    new = [(f"new{i}", True, 1) for i in range(50)]
    history = ReplayBuffer([(f"old{i}", True, 0) for i in range(20)])
    rng = random.Random(0)
    for step in range(5):
        batch = mixed_batch(new, step * batch_size, history, batch_size, replay, rng)
        assert len(batch) == batch_size
        assert sum(t.startswith("old") for t, _, _ in batch) == expected
    assert mixed_batch(new, 0, ReplayBuffer(), 10, 0.1, rng) == new[:10]


def test_training_raises_held_out_accuracy_and_keeps_a_history():
    torch.manual_seed(0)
    tok = load_tokenizer(EMBEDDED_MODEL_DIR)
    model = new_reward_model(str(EMBEDDED_MODEL_DIR), tok)
    train, held = labelled(96, seed=1), labelled(40, seed=2)
    before = accuracy(model, tok, held)
    history = ReplayBuffer()
    losses = train_reward_model(model, tok, train, steps=60, batch_size=16, lr=3e-3, history=history)
    after = accuracy(model, tok, held)
    assert after >= 0.8 and after > before + 0.2, (before, after)
    assert sum(losses[-10:]) < sum(losses[:10]) and len(history.items) == len(train)
    more = train_reward_model(model, tok, labelled(32, seed=3), steps=5, batch_size=10, history=history, replay=0.1,
                              loss="pairwise")
    assert len(more) == 5 and len(history.items) == len(train) + 32


def test_cli_trains_a_reward_model_that_loads_as_a_reward(tmp_path, capsys):
    from grpo.cli.main import main
    from grpo.rewards import load_reward

    samples = tmp_path / "s.jsonl"
    rows = arithmetic.generate("train", 60, seed=4)
    lines = []
    for i, r in enumerate(rows):
        lines.append(json.dumps({"prompt": r["prompt"], "completion": completion(i, r["answer"])[0],
                                 "answer": r["answer"]}))
    samples.write_text("\n".join(lines) + "\n")
    out = tmp_path / "rm"
    assert main(["reward-model", "--samples", str(samples), "--label", "format", "--out", str(out),
                 "--steps", "40", "--lr", "3e-3"]) == 0
    assert "held-out accuracy" in capsys.readouterr().out
    again = tmp_path / "rm2"                                   # the next iteration: from rm/, replaying s.jsonl
    assert main(["reward-model", "--samples", str(samples), "--history", str(samples), "--replay", "0.1",
                 "--label", "format", "--base", str(out), "--out", str(again), "--steps", "3"]) == 0
    name, fn = load_reward(str(out))
    assert name == "rm:rm" and len(fn([rows[0]["prompt"]], ["<answer>1</answer>"])) == 1
    capsys.readouterr()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    assert main(["reward-model", "--samples", str(bad), "--label", "accuracy", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {bad}:1: a row needs 'prompt' and 'completion'"
