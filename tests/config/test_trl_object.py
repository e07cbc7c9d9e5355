"""A TRL GRPOConfig object as config: TRL's defaults apply to the mapped training keys, and what __post_init__
derives is not taken for a user's setting (a stand-in dataclass reproduces each derived-field behaviour; the real
GRPOConfig is used too when TRL is importable)."""

import dataclasses
import enum
import os
import sys
import warnings

import pytest

from grpo.api.inputs import resolve_config
from grpo.config import ConfigError, build_config
from grpo.config.trl_object import trl_fields


class SchedulerType(enum.Enum):                   # transformers' enums, as __post_init__ turns the strings into them
    LINEAR = "linear"
    COSINE = "cosine"


class SaveStrategy(enum.Enum):
    STEPS = "steps"
    NO = "no"


@dataclasses.dataclass
class GRPOConfig:
    """Stands in for TRL's: a dataclass whose __post_init__ derives fields, as TrainingArguments / GRPOConfig do."""
    output_dir: str = "trainer_output"
    learning_rate: float = 1e-6
    beta: float = 0.0
    loss_type: str = "dapo"
    seed: int = 42
    max_completion_length: int = 512
    num_generations: int = 8
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None
    lr_scheduler_type: str = "linear"
    save_strategy: str = "steps"
    scale_rewards: str | bool = "group"
    logging_steps: int = 10
    use_cpu: bool = False
    dataloader_pin_memory: bool = True
    activation_checkpointing: bool = False
    gradient_checkpointing: bool = True
    debug: str | list = ""
    pad_to_multiple_of: int | str | None = "auto"    # declared "auto", resolved to None (TRL: 128 on neuron)
    use_vllm: bool = False                           # TRL 1.16's generation-backend fields and defaults
    vllm_mode: str = "colocate"
    vllm_model_impl: str = "vllm"
    vllm_server_host: str = "0.0.0.0"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_length: int | None = None
    vllm_group_port: int = 51216
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_max: float | None = 3.0

    def __post_init__(self):
        self.pad_to_multiple_of = None if self.pad_to_multiple_of == "auto" else self.pad_to_multiple_of
        self.lr_scheduler_type = SchedulerType(self.lr_scheduler_type)
        self.save_strategy = SaveStrategy(self.save_strategy)
        self.activation_checkpointing = self.gradient_checkpointing       # transformers' renamed field
        self.debug = [self.debug] if self.debug else []
        self.dataloader_pin_memory = self.dataloader_pin_memory and not self.use_cpu
        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        if self.generation_batch_size is None:                           # TRL fills both
            self.generation_batch_size = self.per_device_train_batch_size * self.steps_per_generation
        else:
            self.steps_per_generation = self.generation_batch_size // self.per_device_train_batch_size


#: What TRL's defaults (those the stand-in declares) give here, against grpo's own defaults.
TRL_DEFAULTS = {"optim.lr": 1e-6, "algorithm.beta": 0.0, "algorithm.loss_agg_mode": "token-mean", "train.seed": 42,
                "rollout.max_new_tokens": 512, "rollout.num_generations": 8, "train.micro_batch_size": 8,
                "train.prompts_per_step": 1, "optim.lr_scheduler": "linear", "train.output_dir": "trainer_output",
                "model.device": "auto", "train.gradient_checkpointing": True}


def test_trl_defaults_apply_to_the_mapped_keys_and_derived_fields_are_not_settings():
    assert resolve_config(GRPOConfig()) == build_config(overrides=TRL_DEFAULTS)


def test_fields_the_user_set_map_as_in_a_dict():
    cfg = resolve_config(GRPOConfig(output_dir="runs/x", learning_rate=5e-6, lr_scheduler_type="cosine",
                                    save_strategy="no", scale_rewards=False, use_cpu=True, logging_steps=1))
    assert cfg == build_config(overrides={**TRL_DEFAULTS, "train.output_dir": "runs/x", "optim.lr": 5e-6,
                                          "optim.lr_scheduler": "cosine", "train.save_steps": 0,
                                          "algorithm.scale_rewards": "none", "model.device": "cpu"})


@pytest.mark.parametrize("kwargs", [{"gradient_accumulation_steps": 2, "steps_per_generation": 8},
                                    {"gradient_accumulation_steps": 2, "generation_batch_size": 64}])
def test_both_generation_sizes_filled_are_one_setting(kwargs):
    fields = trl_fields(GRPOConfig(**kwargs))
    assert fields["steps_per_generation"] == 8 and "generation_batch_size" not in fields
    cfg = resolve_config(GRPOConfig(**kwargs))      # 8 x 8 = 64 completions = 8 prompts, 8 / 2 = 4 updates on them
    assert (cfg.train.prompts_per_step, cfg.algorithm.mini_batches, cfg.train.micro_batch_size) == (8, 4, 8)


def test_enums_become_their_values_and_unchanged_derived_fields_are_left_out():
    fields = trl_fields(GRPOConfig(lr_scheduler_type="cosine", gradient_checkpointing=False))
    assert fields["lr_scheduler_type"] == "cosine" and fields["gradient_checkpointing"] is False
    assert not {"activation_checkpointing", "debug", "dataloader_pin_memory", "pad_to_multiple_of",
                "save_strategy", "logging_steps"} & set(fields)
    assert "dataloader_pin_memory" not in trl_fields(GRPOConfig(use_cpu=True))   # derived from use_cpu


def test_a_field_grpo_does_not_map_is_an_error_once_set():
    @dataclasses.dataclass
    class WithExtra(GRPOConfig):
        label_smoothing_factor: float = 0.0

    assert resolve_config(WithExtra()) == build_config(overrides=TRL_DEFAULTS)
    with pytest.raises(ConfigError, match="key 'label_smoothing_factor': no TRL key grpo maps"):
        resolve_config(WithExtra(label_smoothing_factor=0.1))


def test_vllm_fields_map_when_set_and_their_defaults_change_nothing():
    """use_vllm=True is rollout.engine vllm with TRL's rollout correction (sequence_mask, C_max 3.0); the vllm_*
    fields at TRL's defaults leave rollout.vllm at grpo's (the same, or no result changes), and with use_vllm off
    the correction fields' defaults correct nothing."""
    cfg = resolve_config(GRPOConfig(use_vllm=True, vllm_gpu_memory_utilization=0.5, vllm_max_model_length=1024))
    assert cfg == build_config(overrides={**TRL_DEFAULTS, "rollout.engine": "vllm",
                                          "rollout.vllm.gpu_memory_utilization": 0.5,
                                          "rollout.vllm.max_model_length": 1024})
    assert (cfg.algorithm.rollout_correction, cfg.algorithm.rollout_correction.params.max) == ("sequence_mask", 3.0)
    assert (cfg.rollout.vllm.mode, cfg.rollout.vllm.model_impl) == ("colocate", "auto")
    off = resolve_config(GRPOConfig(use_vllm=True, vllm_importance_sampling_correction=False, vllm_mode="server"))
    assert (off.rollout.engine, off.rollout.vllm.mode, off.algorithm.rollout_correction) == ("vllm", "server", "none")
    token = resolve_config(GRPOConfig(use_vllm=True, vllm_importance_sampling_mode="token_truncate"))
    assert token.algorithm.rollout_correction == "token_truncate"
    assert resolve_config(GRPOConfig()).algorithm.rollout_correction == "none"


# ---------------------------------------------------------------- the real TRL GRPOConfig, when importable

TRL_SITE = os.path.join(os.path.dirname(__file__), "..", "..", "bench", ".trl-venv", "lib",
                        f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")


def _real_grpo_config():
    try:
        from trl import GRPOConfig as Real
    except ImportError:
        if not os.path.isdir(os.path.join(TRL_SITE, "trl")):
            pytest.skip("TRL is not importable (it is no test dependency)")
        sys.path.append(TRL_SITE)              # the benchmark's TRL, on top of this environment's transformers
        try:
            from trl import GRPOConfig as Real
        except Exception as e:                 # a TRL too new or too old for this transformers
            pytest.skip(f"TRL is not importable here: {type(e).__name__}: {e}")
    return Real


def _real(**kwargs):
    Real = _real_grpo_config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Real(bf16=False, **kwargs)


def test_a_real_grpo_config_gives_trl_defaults(tmp_path):
    cfg = resolve_config(_real(output_dir=str(tmp_path)))
    assert cfg == build_config(overrides={
        **TRL_DEFAULTS, "train.output_dir": str(tmp_path), "optim.adam_beta2": 0.999,
        "algorithm.kl_ratio_correction": True, "train.disable_dropout": False, "train.precision": "fp32",
        "train.num_train_epochs": 3.0})                       # max_steps -1: TRL's 3 epochs over the training set


def test_a_real_grpo_config_maps_what_the_user_set(tmp_path):
    cfg = resolve_config(_real(output_dir=str(tmp_path), max_steps=8, num_generations=2, per_device_train_batch_size=4,
                               gradient_accumulation_steps=2, steps_per_generation=4, max_completion_length=6,
                               lr_scheduler_type="cosine", save_strategy="no", scale_rewards=False, use_cpu=True,
                               optim="adamw_torch", loss_type="grpo", beta=0.04))
    assert (cfg.train.max_steps, cfg.train.prompts_per_step, cfg.algorithm.mini_batches) == (4, 8, 2)
    assert (cfg.optim.lr_scheduler, cfg.train.save_steps, cfg.algorithm.advantage.params.scale_rewards) == \
        ("cosine", 0, "none")
    assert (cfg.model.device, cfg.algorithm.loss_agg_mode, cfg.algorithm.beta) == ("cpu", "seq-mean-token-mean", 0.04)
    assert (cfg.rollout.max_new_tokens, cfg.train.seed, cfg.optim.adam_beta2) == (6, 42, 0.999)


def test_a_real_grpo_config_with_vllm(tmp_path):
    cfg = resolve_config(_real(output_dir=str(tmp_path), use_vllm=True, vllm_mode="colocate",
                               vllm_gpu_memory_utilization=0.5, vllm_tensor_parallel_size=2, vllm_enable_sleep_mode=True,
                               vllm_max_model_length=2048, generation_kwargs={"top_k": 20, "max_tokens": 64}))
    vllm = cfg.rollout.vllm
    assert cfg.rollout.engine == "vllm"
    assert (vllm.mode, vllm.gpu_memory_utilization, vllm.tensor_parallel_size, vllm.enable_sleep_mode,
            vllm.max_model_length, vllm.model_impl) == ("colocate", 0.5, 2, True, 2048, "auto")
    assert cfg.algorithm.rollout_correction.as_dict() == {"name": "sequence_mask", "min": None, "max": 3.0}   # TRL's
    assert (cfg.rollout.top_k, cfg.rollout.max_new_tokens) == (20, 64)
    server = resolve_config(_real(output_dir=str(tmp_path), use_vllm=True, vllm_mode="server",
                                  vllm_server_base_url="http://gen:8000", vllm_importance_sampling_correction=False))
    assert (server.rollout.vllm.mode, server.rollout.vllm.server_base_url) == ("server", "http://gen:8000")
    assert server.algorithm.rollout_correction == "none"
    plain = resolve_config(_real(output_dir=str(tmp_path)))
    assert (plain.rollout.engine, plain.algorithm.rollout_correction) == ("auto", "none")


def test_a_real_grpo_config_refuses_an_optimizer_grpo_lacks(tmp_path):
    with pytest.raises(ConfigError, match="TRL key 'optim': 'adafactor' is transformers' optimizer name"):
        resolve_config(_real(output_dir=str(tmp_path), optim="adafactor"))


def test_the_printed_mapping_names_the_fields_set_and_counts_the_defaults(capsys):
    resolve_config(GRPOConfig(learning_rate=7e-6, logging_steps=3))
    err = capsys.readouterr().err
    assert "learning_rate -> optim.lr; logging_steps ignored (every step is logged); " in err
    assert "beta -> algorithm.beta" not in err and "TRL's GRPOConfig defaults for the " in err
