"""grpo.Trainer: objects in (model, tokenizer, datasets, reward callables, config forms), callbacks, evaluate."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import grpo
from grpo.config import ConfigError, build_config
from grpo.modeling.models import build_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]

#: The README's promise: a short script trains from objects, with no file written by the user.
SCRIPT = """\
import torch, grpo
from grpo.modeling.models import build_model, build_tokenizer

tok = build_tokenizer()
model = build_model(tok, "micro", seed=0)
before = [p.detach().clone() for p in model.parameters()]
rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(5) for b in range(5)]

def digits(completions, solution, **kwargs):          # TRL's reward signature
    return [float(sum(ch.isdigit() for ch in c)) + float(s in c) for c, s in zip(completions, solution)]

trainer = grpo.Trainer(model, reward_funcs=[digits], train_dataset=rows, tokenizer=tok,
                       config={"max_steps": 2, "num_generations": 4, "learning_rate": 1e-2,
                               "max_completion_length": 6, "train.prompts_per_step": 2,
                               "log.progress_bar": False, "cpu.num_threads": 1})
result = trainer.train()
changed = any(not torch.equal(a, b) for a, b in zip(before, result.model.parameters()))
print("STEPS", result.steps, "CHANGED", changed, "REWARD", "reward/digits/mean" in result.metrics)
"""


def micro():
    tok = build_tokenizer()
    return build_model(tok, "micro", seed=0), tok


def tiny(out, **over):
    return {"max_steps": 2, "num_generations": 4, "learning_rate": 1e-2, "max_completion_length": 6,
            "train.prompts_per_step": 2, "log.progress_bar": False, "cpu.num_threads": 1,
            "train.output_dir": str(out), **over}


ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(6) for b in range(6)]


def digits(completions, solution, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) + float(s in c) for c, s in zip(completions, solution)]


def test_a_short_script_trains_from_objects_with_nothing_written_by_the_user(tmp_path):
    assert len(SCRIPT.strip().splitlines()) <= 20
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "STEPS 2 CHANGED True REWARD True" in done.stdout
    assert "learning_rate -> optim.lr" in done.stderr              # the TRL mapping is printed once
    assert done.stderr.count("TRL keys mapped") == 1
    assert (tmp_path / "runs" / "train" / "checkpoint-2" / "model.safetensors").is_file()


def test_datasets_dataset_async_reward_and_weighted_tuple(tmp_path):
    from datasets import Dataset

    seen = {}

    async def length_bonus(prompts, completions, completion_ids, **kwargs):
        seen["ids"] = completion_ids
        return [len(ids) / 10 for ids in completion_ids]

    model, tok = micro()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = grpo.Trainer(model, reward_funcs=[digits, (length_bonus, 0.5)], config=tiny(tmp_path),
                           train_dataset=Dataset.from_list(ROWS), tokenizer=tok)
    assert trainer.config.reward.functions == ["digits", "length_bonus"]
    assert trainer.config.reward.weights == [1.0, 0.5]
    result = trainer.train()
    assert result.steps == 2 and any(not torch.equal(a, b) for a, b in zip(before, result.model.parameters()))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    m = records[-1]
    assert {"reward/digits/mean", "reward/length_bonus/mean"} <= set(m)
    # total = 1.0 * digits + 0.5 * length_bonus, exactly, per completion -> on the means too
    assert m["reward/total/mean"] == pytest.approx(m["reward/digits/mean"] + 0.5 * m["reward/length_bonus/mean"], rel=1e-5)
    assert isinstance(seen["ids"][0], list) and all(isinstance(t, int) for t in seen["ids"][0])


def test_reward_forms_and_names():
    from grpo.api.inputs import resolve_rewards

    cfg = build_config()

    def fn(completions, **kw):
        return [1.0] * len(completions)

    import functools

    from grpo.api.inputs import reward_name

    rewards, weights = resolve_rewards(["format", fn, ("renamed", fn), ("third", fn, 2.0)], cfg)
    assert [n for n, _ in rewards] == ["format", "fn", "renamed", "third"] and weights == [1.0, 1.0, 1.0, 2.0]
    assert reward_name(functools.partial(fn)) == "fn" and reward_name(Recorder()) == "Recorder"
    with pytest.raises(ConfigError, match="two reward functions are named 'fn'"):
        resolve_rewards([fn, fn], cfg)
    rewards, weights = resolve_rewards([fn, ("other", fn, 2.0)], cfg)
    assert [n for n, _ in rewards] == ["fn", "other"] and weights == [1.0, 2.0]
    rewards, weights = resolve_rewards(None, build_config(overrides={"reward.functions": ["format", "accuracy"]}))
    assert [n for n, _ in rewards] == ["format", "accuracy"] and weights is None     # the config's reward.functions
    with pytest.raises(ConfigError, match="reward.weights has 1 weights for 2"):
        resolve_rewards([fn, "format"], build_config(overrides={"reward.weights": [1.0], "reward.functions": ["format"]}))
    with pytest.raises(TypeError, match=r"reward_funcs\[0\]"):
        resolve_rewards([42], cfg)


def test_config_forms_resolve_to_the_same_config(tmp_path):
    from grpo.api.inputs import resolve_config

    ours = build_config(overrides={"optim.lr": 3e-6, "rollout.num_generations": 16})
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("optim:\n  lr: 3.0e-6\nrollout:\n  num_generations: 16\n")
    assert resolve_config(ours) == ours
    assert resolve_config({"optim": {"lr": 3e-6}, "rollout": {"num_generations": 16}}) == ours
    assert resolve_config({"optim.lr": 3e-6, "rollout.num_generations": 16}) == ours
    assert resolve_config({"learning_rate": 3e-6, "num_generations": 16}) == ours
    assert resolve_config(str(yaml_file)) == ours
    trl_file = tmp_path / "trl.yaml"
    trl_file.write_text("learning_rate: 3.0e-6\nnum_generations: 16\nlogging_steps: 10\n")
    assert resolve_config(trl_file) == ours
    with pytest.raises(ConfigError, match="TRL key 'push_to_hub': no hub uploads here"):
        resolve_config({"push_to_hub": True})
    with pytest.raises(ConfigError, match="config must be a grpo Config"):
        resolve_config(42)


def test_model_object_gets_lora_dtype_and_tokenizer_from_its_directory(tmp_path):
    model, tok = micro()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")     # name_or_path: its directory
    trainer = grpo.Trainer(loaded, config=tiny(tmp_path / "out", **{"lora.enabled": True, "lora.r": 4}),
                           reward_funcs=[digits], train_dataset=ROWS)
    from grpo.modeling.lora import is_lora

    assert is_lora(trainer.model) and trainer.tokenizer.padding_side == "left"
    result = trainer.train()
    assert (result.checkpoint / "adapter_config.json").is_file()
    with pytest.raises(ConfigError, match="lora.enabled: the model already has LoRA adapters"):
        grpo.Trainer(trainer.model, tokenizer=tok, reward_funcs=[digits], train_dataset=ROWS,
                     config=tiny(tmp_path / "o2", **{"lora.enabled": True}))
    half, _ = micro()
    trainer = grpo.Trainer(half, tokenizer=tok, reward_funcs=[digits], train_dataset=ROWS,
                           config=tiny(tmp_path / "o3", **{"model.dtype": "bfloat16"}))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    bare, _ = micro()
    bare.name_or_path = ""
    with pytest.raises(ValueError, match="pass tokenizer="):
        grpo.Trainer(bare, reward_funcs=[digits], train_dataset=ROWS, config=tiny(tmp_path / "o4"))


class Recorder:
    def __init__(self, stop_at=None):
        self.steps, self.checkpoints, self.results, self.stop_at = [], [], [], stop_at

    def on_step_end(self, step, metrics):
        self.steps.append((step, metrics["reward/total/mean"]))
        return step == self.stop_at

    def on_checkpoint(self, path):
        self.checkpoints.append(Path(path).name)

    def on_train_end(self, result):
        self.results.append(result)


def test_callbacks_see_every_step_and_can_stop_the_run_with_a_checkpoint(tmp_path):
    model, tok = micro()
    rec, other = Recorder(stop_at=2), Recorder()
    trainer = grpo.Trainer(model, reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok, callbacks=[rec, other],
                           config=tiny(tmp_path, max_steps=5, **{"train.save_steps": 0}))
    result = trainer.train()
    assert [s for s, _ in rec.steps] == [1, 2] and other.steps == rec.steps
    assert result.stopped_by == "callback" and result.steps == 2
    assert rec.checkpoints == ["checkpoint-2"] and (tmp_path / "checkpoint-2" / "trainer_state.json").is_file()
    assert rec.results == [result]
    with pytest.raises(TypeError, match=r"callbacks\[0\] \(object\) has none of the methods"):
        grpo.Trainer(model, reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok, callbacks=[object()],
                     config=tiny(tmp_path / "x"))


def test_evaluate_on_rows_and_on_the_embedded_task(tmp_path):
    model, tok = micro()
    trainer = grpo.Trainer(model, reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok, config=tiny(tmp_path),
                           eval_dataset=ROWS[:8])
    scores = trainer.evaluate(max_new_tokens=4)
    assert set(scores) == {"digits", "completion_length"} and 0 < scores["completion_length"] <= 4
    assert trainer.evaluate(ROWS[:3], max_new_tokens=4).keys() == scores.keys()
    trainer = grpo.Trainer(model, tokenizer=tok, config=tiny(tmp_path / "e"))
    scores = trainer.evaluate(num_problems=8, max_new_tokens=4)
    assert set(scores) == {"accuracy", "format", "completion_length"}


def test_evaluate_bounds_rewards_by_the_configs_timeout(tmp_path):
    """evaluate() calls the rewards as training does: reward.timeout_s bounds each call and
    reward.reward_errors=zero scores a timed-out batch 0.0."""
    import time

    def slow(completions, **kw):
        time.sleep(2.0)
        return [1.0] * len(completions)

    model, tok = micro()
    cfg = tiny(tmp_path, **{"reward.timeout_s": 0.2})
    trainer = grpo.Trainer(model, reward_funcs=[slow], train_dataset=ROWS, tokenizer=tok, config=cfg)
    with pytest.raises(Exception, match=r"reward function 'slow' did not return within reward.timeout_s=0.2 s"):
        trainer.evaluate(ROWS[:2], max_new_tokens=2)
    trainer = grpo.Trainer(model, reward_funcs=[slow], train_dataset=ROWS, tokenizer=tok,
                           config={**cfg, "reward.reward_errors": "zero"})
    assert trainer.evaluate(ROWS[:2], max_new_tokens=2)["slow"] == 0.0


def test_dataset_forms(tmp_path):
    from grpo.data.datasets_io import DataError
    from grpo.api.inputs import resolve_dataset

    rec, path = resolve_dataset({"prompt": ["a", "b"], "answer": ["1", "2"]}, "train")
    assert path is None and rec.rows == [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    assert resolve_dataset("data.jsonl", "train") == (None, "data.jsonl")
    with pytest.raises(DataError, match="train_dataset: row 1 must be a dict"):
        resolve_dataset([{"prompt": "a"}, "b"], "train")
    with pytest.raises(DataError, match="no column 'prompt'"):
        grpo.Trainer(micro()[0], tokenizer=build_tokenizer(), reward_funcs=[digits],
                     train_dataset=[{"question": "1+1="}], config=tiny(tmp_path)).train()
    # data.column_map applies to in-memory rows as to files
    model, tok = micro()
    trainer = grpo.Trainer(model, tokenizer=tok, reward_funcs=[digits], config=tiny(tmp_path / "m", **{
        "data.column_map": {"question": "prompt"}}), train_dataset=[{"question": r["prompt"], "solution": r["solution"]}
                                                                   for r in ROWS])
    assert trainer.train().steps == 2


def test_train_shim_and_cli_share_the_api_path(tmp_path, monkeypatch):
    import grpo.api.trainer

    calls = []
    real = grpo.api.trainer.Trainer.train
    monkeypatch.setattr(grpo.api.trainer.Trainer, "train", lambda self: calls.append(self) or real(self))
    from grpo.cli.main import main

    reward = tmp_path / "r.py"
    reward.write_text("def d(completions, **kw):\n    return [float(len(c)) for c in completions]\n")
    assert main(["train", "--output-dir", str(tmp_path / "o"), "--max-steps", "1", "--reward", f"{reward}:d",
                 "--rollout.num_generations", "2", "--train.prompts_per_step", "2", "--rollout.max_new_tokens", "4",
                 "--log.progress_bar", "false", "--train.save_final", "false"]) == 0
    assert len(calls) == 1 and calls[0].config.train.max_steps == 1


def test_a_peft_model_trains_its_own_adapters_against_the_adapter_free_reference(tmp_path):
    from grpo.config import LoraConfig
    from grpo.modeling.lora import apply_lora
    from grpo.modeling.reference import AdapterDisabled

    model, tok = micro()
    peft_model = apply_lora(model, LoraConfig(r=2, alpha=4))
    trainer = grpo.Trainer(peft_model, tokenizer=tok, reward_funcs=[digits], train_dataset=ROWS, config=tiny(tmp_path))
    assert trainer.model is peft_model
    adapters = {n: p.detach().clone() for n, p in peft_model.named_parameters() if p.requires_grad}
    base = {n: p.detach().clone() for n, p in peft_model.named_parameters() if not p.requires_grad}
    result = trainer.train()
    after = dict(result.model.named_parameters())
    assert any(not torch.equal(v, after[n]) for n, v in adapters.items())        # adapters trained
    assert all(torch.equal(v, after[n]) for n, v in base.items())                 # base frozen
    # built in memory, the base has no directory to name: the checkpoint holds the merged model (grpo/state/model_files.py)
    assert (result.checkpoint / "model.safetensors").is_file()
    from grpo.modeling.reference import build_reference

    assert isinstance(build_reference(peft_model, 0.04), AdapterDisabled)


def test_model_dtype_that_cannot_apply_names_the_key():
    from grpo.api.inputs import cast_dtype

    model, _ = micro()
    model.register_parameter("codes", torch.nn.Parameter(torch.zeros(4, dtype=torch.int8), requires_grad=False))
    with pytest.raises(ConfigError, match=r"model.dtype=float32: the model has non-floating parameters \(torch.int8"):
        cast_dtype(model, "float32")
    with pytest.raises(TypeError, match="model must be a local model directory or a torch.nn.Module"):
        grpo.Trainer(42, reward_funcs=[digits], train_dataset=ROWS)


def test_rewards_default_to_the_embedded_tasks_and_a_dataset_needs_one(tmp_path):
    """No reward named: the embedded task's own (declared with the task); on a user dataset (in memory or
    a file) a one-line error before anything is written, through the API and the CLI."""
    from grpo.cli.main import main
    from grpo.data.tasks import arithmetic

    model, tok = micro()
    trainer = grpo.Trainer(model, tokenizer=tok, config=tiny(tmp_path / "task"))
    assert [n for n, _ in trainer.rewards] == list(arithmetic.DEFAULT_REWARDS) == ["accuracy", "format"]
    assert trainer.config.reward.functions == ["accuracy", "format"]             # config.yaml records them
    with pytest.raises(ConfigError, match=r"^no reward function for dataset train_dataset \(in memory\): pass "
                                          r"--reward NAME \(CLI\), reward_funcs=\[...\] \(Python\)"):
        grpo.Trainer(model, tokenizer=tok, train_dataset=ROWS, config=tiny(tmp_path / "mem"))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "cli"
    assert main(["train", "--dataset", str(data), "--output-dir", str(out), "--max-steps", "1"]) == 2
    assert not out.exists() or not any(out.iterdir())                            # nothing written


def test_progress_bar_shows_the_first_reward_functions_mean(tmp_path):
    from grpo.state.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path / "m.jsonl", 2, progress_bar=True)
    with logger:
        logger.log({"step": 1, "reward/total/mean": 0.5, "reward/correctness/mean": 0.25, "reward/fmt/mean": 1.0,
                    "completion/length_mean": 7.0, "kl/mean": 0.01})
        shown = logger.bar.postfix
    assert "correctnes=0.25" in shown and "fmt" not in shown and "acc" not in shown


def test_lean_layers_key_switches_the_policy_and_it_trains(tmp_path):
    from grpo.modeling.lean_layers import lean_mlps

    model, tok = micro()
    trainer = grpo.Trainer(model, tokenizer=tok, reward_funcs=[digits], train_dataset=ROWS,
                           config=tiny(tmp_path / "on", **{"train.lean_layers": True}))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    assert lean_mlps(trainer.model) == trainer.model.config.num_hidden_layers
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    off, tok = micro()
    assert lean_mlps(grpo.Trainer(off, tokenizer=tok, reward_funcs=[digits], train_dataset=ROWS,
                                  config=tiny(tmp_path / "off")).model) == 0   # off by default


def test_trainer_weights_twice_and_trl_reward_weights_with_reward_funcs(tmp_path):
    from grpo.api.inputs import WEIGHTS_TWICE

    with pytest.raises(ConfigError) as e:
        grpo.Trainer(str(tmp_path / "no-model"), reward_funcs=[(digits, 2.0)], train_dataset=ROWS,
                     config={"reward.weights": [2.0]})
    assert str(e.value) == WEIGHTS_TWICE
    model, tok = micro()
    trainer = grpo.Trainer(model, reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok,
                           config=tiny(tmp_path / "w", reward_weights=[2.0]))
    assert (trainer.config.reward.functions, trainer.config.reward.weights) == (["digits"], [2.0])
