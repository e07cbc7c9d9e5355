"""grpo/training/reward_model_updates.py: reward.reward_model_update, the reward model retrained inside a
GRPO run on the policy's own samples with replay (DeepSeekMath's iterative RL)."""

import json

import pytest
import torch
from safetensors.torch import load_file

import grpo.training.reward_model_training as rmt
from grpo.config import ConfigError, build_config
from grpo.data.tasks import arithmetic
from grpo.modeling.models import EMBEDDED_MODEL_DIR, load_tokenizer
from grpo.rewards import load_reward
from grpo.state.model_files import load_checkpoint
from grpo.training.evaluate import generate_texts
from grpo.training.reward_model_training import accuracy, new_reward_model
from grpo.training.reward_model_updates import STATE_FILE, WEIGHTS_DIR
from tests.run_helpers import assert_same_run, run_in_process, tiny_config


def make_rm(directory):
    """A fresh single-logit reward model on the embedded policy's backbone."""
    tok = load_tokenizer(EMBEDDED_MODEL_DIR)
    torch.manual_seed(0)
    new_reward_model(str(EMBEDDED_MODEL_DIR), tok).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def run_flat(tmp_path, out, **over):
    rm = tmp_path / "rm" if (tmp_path / "rm").is_dir() else make_rm(tmp_path / "rm")
    flat = tiny_config(EMBEDDED_MODEL_DIR, str(rm), out, **{
        "reward.functions": ["accuracy", str(rm)], "train.prompts_per_step": 4, "rollout.num_generations": 4,
        "rollout.max_new_tokens": 32, "optim.lr": 1e-4, "algorithm.ref_update_steps": 2,
        "reward.reward_model_update": {"every": 2, "replay": 0.1, "label": "accuracy", "steps": 25,
                                       "batch_size": 10, "lr": 2e-3}})
    flat.pop("model.path")
    return {**flat, "model.path": str(EMBEDDED_MODEL_DIR), **over}


def held_out_items(tok, n=96):
    """Sampled completions of the embedded policy on held-out problems, labelled by the accuracy reward."""
    model, _ = load_checkpoint(str(EMBEDDED_MODEL_DIR))
    rows = arithmetic.generate("test", n, seed=5)
    texts = generate_texts(model, tok, rows, max_new_tokens=32, temperature=1.0, seed=3)
    fn = load_reward("accuracy")[1]
    values = fn([r["prompt"] for r in rows], texts, answer=[r["answer"] for r in rows])
    return [(r["prompt"] + t, True, int(v >= 0.5)) for r, t, v in zip(rows, texts, values)]


def test_the_run_trains_its_reward_model_with_replay_and_it_judges_better(tmp_path, monkeypatch):
    seen = []
    real = rmt.mixed_batch

    def spy(new, start, history, batch_size, replay, rng):
        batch = real(new, start, history, batch_size, replay, rng)
        old = {id(x) for x in (history.items if history is not None else [])}
        seen.append((len(batch), sum(id(x) in old for x in batch), bool(old)))
        return batch

    monkeypatch.setattr(rmt, "mixed_batch", spy)
    tok = load_tokenizer(EMBEDDED_MODEL_DIR)
    rm_dir = make_rm(tmp_path / "rm")
    held = held_out_items(tok)
    before = accuracy(load_reward(str(rm_dir))[1].model, tok, held)
    out = tmp_path / "run"
    result = run_in_process(run_flat(tmp_path, out, **{"train.max_steps": 8}))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "reward_model/updates" in r]
    assert [r["step"] for r in updates] == [2, 4, 6, 8] and updates[-1]["reward_model/updates"] == 4.0
    assert all(r["reward_model/samples"] == 2 * 4 * 4 for r in updates)       # two steps of 4 prompts x G = 4
    # replay: 10% of every batch of 10 (one row) once a history exists (updates 2..4), none in the first
    assert len(seen) == 4 * 25 and all(size == 10 for size, _, _ in seen)
    assert all(n == 0 for _, n, has in seen[:25]) and all(n == 1 for _, n, has in seen[25:])
    # the checkpoint holds the retrained reward model, and it judges held-out samples better than the start
    ckpt = result.checkpoint
    assert (ckpt / STATE_FILE).is_file() and (ckpt / WEIGHTS_DIR / "model.safetensors").is_file()
    start = load_file(str(rm_dir / "model.safetensors"))
    trained = load_file(str(ckpt / WEIGHTS_DIR / "model.safetensors"))
    assert any(not torch.equal(start[k], trained[k]) for k in start)
    rm = load_reward(str(rm_dir))[1]
    rm.model.load_state_dict(trained, strict=False)
    after = accuracy(rm.model, tok, held)
    assert after > before + 0.1, (before, after)


def test_a_resumed_run_retrains_the_same_reward_model(tmp_path):
    """Stopped at step 3 (between updates, with samples queued) and resumed: the same run bit for bit."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    run_in_process(run_flat(tmp_path, whole, **{"train.max_steps": 6, "train.save_steps": 3}))
    run_in_process(run_flat(tmp_path, part, **{"train.max_steps": 3, "train.save_steps": 3}))
    saved = json.loads((part / "checkpoint-3" / STATE_FILE).read_text())
    assert len(saved["pending"]) == 16 and len(saved["history"]) == 32 and saved["updates"] == 1
    run_in_process(run_flat(tmp_path, part, **{"train.max_steps": 6, "train.save_steps": 3, "train.resume": "auto"}))
    assert_same_run(whole, part, 6)
    a = load_file(str(whole / "checkpoint-6" / WEIGHTS_DIR / "model.safetensors"))
    b = load_file(str(part / "checkpoint-6" / WEIGHTS_DIR / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="reward.reward_model_update.label"):
        build_config({"reward": {"reward_model_update": {"every": 2}}})
    with pytest.raises(ConfigError, match=r"reward.reward_model_update.replay must be in \[0, 1\)"):
        build_config(overrides={"reward.reward_model_update.replay": 1.5})
    with pytest.raises(ConfigError, match="unknown config key 'reward.reward_model_update.evry'"):
        build_config(overrides={"reward.reward_model_update.evry": 2})
    flat = run_flat(tmp_path, tmp_path / "run", **{"reward.functions": ["accuracy"]})
    with pytest.raises(ConfigError, match="reward-model directory in reward.functions.*found: none"):
        run_in_process(flat)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
