"""grpo.api.inputs: TRL keys beside our sections in one dict, and use_peft's LoRA resolved as TRL's ModelConfig
gives it (target modules None: peft's default for the model type)."""

import json

import pytest

from grpo.api.inputs import resolve_config, split_keys
from grpo.config import ConfigError


def test_optim_is_our_section_as_a_mapping_and_trl_s_optimizer_name_as_text():
    assert split_keys({"optim": {"lr": 1e-5}}) == ({"optim": {"lr": 1e-5}}, {}, {})
    assert split_keys({"optim": "adamw_torch", "optim.lr": 2e-6}) == ({}, {"optim.lr": 2e-6}, {"optim": "adamw_torch"})
    assert resolve_config({"optim": {"lr": 1e-5}}).optim.lr == 1e-5
    with pytest.raises(ConfigError, match="config section 'train' must be a mapping"):
        resolve_config({"train": "x"})


def _model_dir(tmp_path, model_type):
    path = tmp_path / model_type
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(path)


@pytest.mark.parametrize("model_type, targets", [("qwen2", ["q_proj", "v_proj"]), ("llama", ["q_proj", "v_proj"]),
                                                 ("gpt2", ["c_attn"])])
def test_use_peft_without_target_modules_gets_peft_s_default_for_the_model_type(tmp_path, model_type, targets):
    cfg = resolve_config({"use_peft": True, "model_name_or_path": _model_dir(tmp_path, model_type)})
    assert (cfg.lora.enabled, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (True, 16, 32, 0.05)
    assert cfg.lora.target_modules == targets


def test_the_model_may_come_from_our_key_or_an_override(tmp_path):
    path = _model_dir(tmp_path, "qwen2")
    assert resolve_config({"use_peft": True, "lora_target_modules": None}, {"model.path": path}).lora.target_modules \
        == ["q_proj", "v_proj"]
    assert resolve_config({"use_peft": True, "model.path": path, "lora.dropout": 0.1}).lora.dropout == 0.1


def test_use_peft_without_a_model_to_read_the_type_from_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="TRL key lora_target_modules: null .* no model is named in the config: "
                                          "name the modules"):
        resolve_config({"use_peft": True})
    with pytest.raises(ConfigError, match="has no config.json"):
        resolve_config({"use_peft": True, "model_name_or_path": str(tmp_path)})


def test_a_mapping_under_a_trl_name_is_a_trl_key_named_with_the_others():
    """lr_scheduler_kwargs: {...} (a TrainingArguments field) is TRL's key, not a misspelt section of ours."""
    assert split_keys({"lr_scheduler_kwargs": {}, "trian": {}}) == ({"trian": {}}, {}, {"lr_scheduler_kwargs": {}})
    with pytest.raises(ConfigError) as e:
        resolve_config({"optim": "adamw_torch", "eval_on_start": True, "lr_scheduler_kwargs": {"a": 1}})
    assert str(e.value) == ("keys 'eval_on_start', 'lr_scheduler_kwargs': no TRL key grpo maps, nor one of its sections "
                            "(docs/migrating-from-trl.md lists the mapped TRL keys; our own keys are given as "
                            "section.key)")
