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


def test_use_peft_without_a_model_directory_leaves_the_targets_to_peft(tmp_path):
    """No model directory to read the type from (a model object, the embedded policy): lora.target_modules is
    `peft-default`, which peft resolves from the model itself when the adapters are made."""
    assert resolve_config({"use_peft": True}).lora.target_modules == ["peft-default"]
    assert resolve_config({"use_peft": True, "model_name_or_path": str(tmp_path)}).lora.target_modules \
        == ["peft-default"]


def test_use_peft_in_a_dict_trains_the_model_object_with_peft_s_default_modules(tmp_path):
    import grpo
    from grpo.modeling.models import build_model, build_tokenizer

    tok = build_tokenizer()
    trainer = grpo.Trainer(build_model(tok, "micro"), reward_funcs=[_acc], tokenizer=tok,
                           train_dataset=[{"prompt": f"{a}+1="} for a in range(4)],
                           config={"use_peft": True, "max_steps": 1, "num_generations": 2,
                                   "per_device_train_batch_size": 4, "max_completion_length": 4,
                                   "output_dir": str(tmp_path / "run"), "log.progress_bar": False})
    adapted = {name.split(".lora_A")[0].split(".")[-1] for name, _ in trainer.train().model.named_parameters()
               if "lora_A" in name}
    assert adapted == {"q_proj", "v_proj"}                  # peft's default for the Qwen2 architecture


def test_a_mapping_under_a_trl_name_is_a_trl_key_named_with_the_others():
    """lr_scheduler_kwargs: {...} (a TrainingArguments field) is TRL's key, not a misspelt section of ours."""
    assert split_keys({"lr_scheduler_kwargs": {}, "trian": {}}) == ({"trian": {}}, {}, {"lr_scheduler_kwargs": {}})
    with pytest.raises(ConfigError) as e:
        resolve_config({"optim": "adamw_torch", "eval_on_start": True, "lr_scheduler_kwargs": {"a": 1}})
    assert str(e.value) == ("keys 'eval_on_start', 'lr_scheduler_kwargs': no TRL key grpo maps, nor one of its sections "
                            "(docs/migrating-from-trl.md lists the mapped TRL keys; our own keys are given as "
                            "section.key)")


def _acc(completions, **kwargs):
    return [0.0] * len(completions)


def _fmt(completions, **kwargs):
    return [0.0] * len(completions)


def test_weights_given_as_tuples_and_in_the_config_are_an_error_saying_so():
    """F-5: the counts match (1 and 1), so the error says the weights were given twice, not a count problem."""
    from grpo.api.inputs import WEIGHTS_TWICE, config_for_rewards, resolve_rewards

    for config in ({"reward.weights": [2.0]}, {"reward_weights": [2.0]}, {"reward": {"weights": [2.0, 1.0]}}):
        funcs = [(_acc, 2.0)] if "reward" not in config else [_acc, (_fmt, 0.5)]
        cfg, weights = config_for_rewards(config, funcs)
        with pytest.raises(ConfigError) as e:
            resolve_rewards(funcs, cfg, None, weights)
        assert str(e.value) == WEIGHTS_TWICE
    assert WEIGHTS_TWICE.startswith("reward weights given twice: as (fn, weight) tuples in reward_funcs and as "
                                    "reward.weights")


def test_config_weights_count_against_reward_funcs():
    """TRL's reward_weights with reward_funcs as objects: the weights fit the functions given, not reward.functions."""
    from grpo.api.inputs import config_for_rewards, resolve_rewards

    cfg, weights = config_for_rewards({"reward_weights": [2.0, 0.5]}, [_acc, _fmt])
    assert weights == [2.0, 0.5] and cfg.reward.weights is None
    assert resolve_rewards([_acc, _fmt], cfg, None, weights) == ([("_acc", _acc), ("_fmt", _fmt)], [2.0, 0.5])
    cfg, weights = config_for_rewards({"reward.weights": [2.0, 1.0]}, [_acc])
    with pytest.raises(ConfigError) as e:
        resolve_rewards([_acc], cfg, None, weights)
    assert str(e.value) == ("reward.weights must have one weight per entry of reward.functions (with reward_funcs "
                            "given, reward.functions are its 1 entries)")
    assert config_for_rewards({"reward.functions": ["format"], "reward.weights": [3.0]}, None)[1] == [3.0]
