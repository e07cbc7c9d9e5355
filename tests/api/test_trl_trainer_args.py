"""TRL GRPOTrainer arguments and methods on grpo.Trainer: peft_config=, train(resume_from_checkpoint=),
save_model()."""

import json

import pytest
import torch
from peft import LoraConfig

import grpo
from grpo.config import ConfigError
from grpo.modeling.models import build_model, build_tokenizer, load_policy

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(6) for b in range(6)]


def digits(completions, solution, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) + float(s in c) for c, s in zip(completions, solution)]


def tiny(out, **over):
    return {"max_steps": 2, "num_generations": 4, "learning_rate": 1e-2, "max_completion_length": 6,
            "train.prompts_per_step": 2, "log.progress_bar": False, "cpu.num_threads": 1,
            "train.output_dir": str(out), **over}


def trainer(tmp_path, **kwargs):
    tok = build_tokenizer()
    return grpo.Trainer(build_model(tok, "micro", seed=0), reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok,
                        **{"config": tiny(tmp_path / "run"), **kwargs})


@pytest.mark.parametrize("peft, expected", [
    (LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["v_proj", "q_proj"], task_type="CAUSAL_LM"),
     {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}),
    (LoraConfig(target_modules="all-linear"), {"r": 8, "alpha": 8, "dropout": 0.0, "target_modules": ["all-linear"]}),
    (LoraConfig(), {"r": 8, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}),   # peft's Qwen2 default
])
def test_peft_config_sets_the_lora_keys(tmp_path, peft, expected):
    t = trainer(tmp_path, peft_config=peft)
    lora = t.config.lora
    assert lora.enabled and {"r": lora.r, "alpha": lora.alpha, "dropout": lora.dropout,
                             "target_modules": lora.target_modules} == expected
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in t.model.named_parameters() if "lora_A" in n}
    assert adapted == ({"q_proj", "v_proj"} if expected["target_modules"] != ["all-linear"] else
                       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


@pytest.mark.parametrize("peft, message", [
    (LoraConfig(use_dora=True, bias="lora_only"), "peft_config fields with no equivalent here: bias, use_dora"),
    (LoraConfig(task_type="SEQ_CLS"), "peft_config.task_type SEQ_CLS: grpo trains causal LMs"),
    ({"r": 8}, "peft_config must be a peft LoraConfig"),
])
def test_peft_config_that_cannot_apply_is_an_error_naming_it(tmp_path, peft, message):
    with pytest.raises(ConfigError, match=message):
        trainer(tmp_path, peft_config=peft)


def test_resume_from_checkpoint_and_save_model(tmp_path):
    first = trainer(tmp_path, config=tiny(tmp_path / "run", **{"train.save_steps": 2}))
    first.train()
    ran = []

    class Steps:
        def on_step_end(self, step, metrics):
            ran.append(step)

    second = trainer(tmp_path, config=tiny(tmp_path / "run", max_steps=3), callbacks=[Steps()])
    result = second.train(resume_from_checkpoint=True)             # continues at step 3 from checkpoint-2
    assert ran == [3] and result.steps == 3 and second.config.train.resume == "auto"
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    saved = second.save_model(tmp_path / "saved")
    model, _ = load_policy(saved)
    for (name, a), b in zip(result.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_trl_attribute_names(tmp_path):
    t = trainer(tmp_path)
    assert t.state.global_step == 0 and t.state.log_history == [] and t.state.max_steps == 2
    t.train()
    assert t.args is t.config and t.processing_class is t.tokenizer
    history = t.state.log_history
    assert t.state.global_step == 2 and [r["step"] for r in history] == [1, 2, 2] and "reward/digits/mean" in history[0]
    assert "train_loss" in history[-1]                  # as in transformers, the last entry is the training summary
