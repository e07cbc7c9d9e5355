"""The configuration tree: the single source of truth for a run.

Every field carries its help text (``metadata["help"]``), which `grpo train --help-config` prints.
Values come from defaults, then a YAML file, then command-line overrides (``--section.key value``);
the tree is validated once and never mutated afterwards.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A bad configuration value or key; its message is one line that names the key."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with help text (lists and dicts get a default_factory)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = _f(None, "Local Hugging Face model directory; empty = the embedded arithmetic base policy.")
    dtype: str = _f("float32", "Parameter dtype: float32 | bfloat16 | float16.")
    trust_remote_code: bool = _f(False, "Allow custom modelling code shipped with the model directory.")


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = _f(None, "JSONL prompt file (a `prompt` column, other columns go to rewards); empty = embedded task.")
    task: str = _f("arithmetic", "Embedded task used when no dataset is given.")
    num_train_prompts: int = _f(20000, "Number of prompts generated from the embedded task's train split.")
    prompt_column: str = _f("prompt", "Name of the prompt column in the dataset.")
    shuffle: bool = _f(True, "Shuffle the prompts every epoch (seeded).")


@dataclass(frozen=True)
class RolloutConfig:
    num_generations: int = _f(8, "G: completions sampled per prompt (TRL: num_generations; verl: rollout.n).")
    max_new_tokens: int = _f(48, "Maximum completion length in tokens (TRL: max_completion_length).")
    temperature: float = _f(1.0, "Sampling temperature; also applied to the logits of the training forward pass.")
    top_p: float = _f(1.0, "Nucleus sampling threshold (1.0 = off).")
    top_k: int = _f(0, "Top-k sampling (0 = off).")


@dataclass(frozen=True)
class RewardConfig:
    functions: list[str] = _f(["accuracy", "format"], "Reward functions: built-in names or `path/to/file.py:function`.")
    weights: list[float] | None = _f(None, "One weight per reward function (default: all 1.0).")


@dataclass(frozen=True)
class AlgorithmConfig:
    advantage_estimator: str = _f("grpo", "Advantage estimator (registry in grpo/advantages.py): grpo | dr_grpo | rloo | reinforce_pp.")
    advantage_eps: float = _f(1e-4, "eps in A = (r - mean) / (std + eps).")
    epsilon: float = _f(0.2, "Lower clip range of the importance ratio: 1 - epsilon.")
    epsilon_high: float | None = _f(None, "Upper clip range 1 + epsilon_high (default: epsilon; DAPO: 0.28).")
    beta: float = _f(0.04, "KL coefficient; 0 skips the reference model entirely.")
    kl_estimator: str = _f("k3", "KL estimator (registry in grpo/loss.py): k3 | k1 | k2.")
    loss_agg_mode: str = _f("seq-mean-token-mean", "Loss aggregation (registry in grpo/loss.py): seq-mean-token-mean | "
                            "token-mean | seq-mean-token-sum | seq-mean-token-sum-norm.")
    loss_norm_length: int = _f(0, "Constant L of seq-mean-token-sum-norm (0 = rollout.max_new_tokens).")
    num_iterations: int = _f(1, "mu: optimizer steps per generation batch (old log-probs stored).")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = _f(1e-6, "AdamW learning rate (peak).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.99, "AdamW beta2.")
    max_grad_norm: float = _f(1.0, "Clip the global gradient norm to this value (0 = no clipping).")
    warmup_steps: int = _f(0, "Linear warm-up steps.")
    lr_scheduler: str = _f("constant", "Schedule after warm-up: constant | linear | cosine.")


@dataclass(frozen=True)
class TrainConfig:
    prompts_per_step: int = _f(8, "B: prompts per step; a step trains on B * G completions.")
    micro_batch_size: int = _f(0, "Completions per forward/backward pass (gradient accumulation); 0 = all at once.")
    max_steps: int = _f(100, "Number of GRPO steps.")
    seed: int = _f(0, "Seed for data order, sampling and initialisation.")
    num_threads: int = _f(0, "CPU threads for torch (0 = torch's default); 1 is often fastest for tiny models.")
    output_dir: str = _f("runs/train", "Where metrics.jsonl and the final checkpoint are written.")
    save_final: bool = _f(True, "Save the trained policy to output_dir/checkpoint-<step> at the end.")


@dataclass(frozen=True)
class LogConfig:
    progress_bar: bool = _f(True, "Show a console progress bar with the headline metrics.")
    metrics_file: str = _f("metrics.jsonl", "Metrics file name inside output_dir (one JSON object per step).")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)


SECTIONS: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "rollout": RolloutConfig, "reward": RewardConfig,
    "algorithm": AlgorithmConfig, "optim": OptimConfig, "train": TrainConfig, "log": LogConfig,
}


def valid_keys() -> list[str]:
    """All `section.key` names, in declaration order."""
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check/convert one value against a field annotation; raise ConfigError naming the key."""
    hint = eval(annotation, vars(typing) | {"types": types}) if isinstance(annotation, str) else annotation  # noqa: S307
    args = typing.get_args(hint)
    optional = type(None) in args
    if value is None:
        if optional:
            return None
        raise ConfigError(f"config key '{key}' may not be empty")
    if optional:
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [_coerce(key, v, item) for v in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}' expects true/false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key '{key}' expects an integer, got {value!r}")
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"config key '{key}' expects a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}' expects a string, got {value!r}")
    return value


def _unknown(key: str) -> ConfigError:
    return ConfigError(f"unknown config key '{key}'; valid keys: {', '.join(valid_keys())}")


def build_config(nested: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Build a validated Config from a nested dict (YAML) and flat `section.key` overrides."""
    merged: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for section, values in (nested or {}).items():
        if section not in SECTIONS:
            raise _unknown(str(section))
        if not isinstance(values, dict):
            raise ConfigError(f"config section '{section}' must be a mapping of keys to values")
        merged[section].update(values)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if section not in SECTIONS or not key:
            raise _unknown(dotted)
        merged[section][key] = value
    built = {}
    for section, cls in SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in merged[section].items():
            if key not in fields:
                raise _unknown(f"{section}.{key}")
            kwargs[key] = _coerce(f"{section}.{key}", value, fields[key].type)
        built[section] = cls(**kwargs)
    cfg = Config(**built)
    validate(cfg)
    return cfg


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file; errors name the file (and line, when YAML reports one)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{p}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return data


def validate(cfg: Config) -> None:
    """Reject settings that cannot work, with a message naming the key."""
    from grpo.advantages import ADVANTAGE_ESTIMATORS
    from grpo.loss import AGGREGATIONS, KL_ESTIMATORS

    checks = [
        (cfg.rollout.num_generations >= 2, "rollout.num_generations must be >= 2: group-relative advantages need a group"),
        (cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1"),
        (cfg.rollout.temperature >= 0, "rollout.temperature must be >= 0"),
        (0 < cfg.rollout.top_p <= 1, "rollout.top_p must be in (0, 1]"),
        (cfg.rollout.top_k >= 0, "rollout.top_k must be >= 0"),
        (cfg.algorithm.epsilon >= 0, "algorithm.epsilon must be >= 0"),
        (cfg.algorithm.epsilon_high is None or cfg.algorithm.epsilon_high >= 0, "algorithm.epsilon_high must be >= 0"),
        (cfg.algorithm.beta >= 0, "algorithm.beta must be >= 0"),
        (cfg.algorithm.advantage_eps >= 0, "algorithm.advantage_eps must be >= 0"),
        (cfg.algorithm.num_iterations >= 1, "algorithm.num_iterations must be >= 1"),
        (cfg.algorithm.loss_norm_length >= 0, "algorithm.loss_norm_length must be >= 0"),
        (cfg.algorithm.advantage_estimator in ADVANTAGE_ESTIMATORS,
         f"algorithm.advantage_estimator must be one of {sorted(ADVANTAGE_ESTIMATORS)}"),
        (cfg.algorithm.kl_estimator in KL_ESTIMATORS, f"algorithm.kl_estimator must be one of {sorted(KL_ESTIMATORS)}"),
        (cfg.algorithm.loss_agg_mode in AGGREGATIONS, f"algorithm.loss_agg_mode must be one of {sorted(AGGREGATIONS)}"),
        (cfg.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype must be float32 | bfloat16 | float16"),
        (cfg.optim.lr > 0, "optim.lr must be > 0"),
        (cfg.optim.max_grad_norm >= 0, "optim.max_grad_norm must be >= 0"),
        (cfg.optim.warmup_steps >= 0, "optim.warmup_steps must be >= 0"),
        (cfg.optim.lr_scheduler in ("constant", "linear", "cosine"), "optim.lr_scheduler must be constant | linear | cosine"),
        (cfg.train.prompts_per_step >= 1, "train.prompts_per_step must be >= 1"),
        (cfg.train.micro_batch_size >= 0, "train.micro_batch_size must be >= 0"),
        (cfg.train.max_steps >= 0, "train.max_steps must be >= 0"),
        (cfg.train.num_threads >= 0, "train.num_threads must be >= 0"),
        (len(cfg.reward.functions) >= 1, "reward.functions must name at least one reward function"),
        (cfg.reward.weights is None or len(cfg.reward.weights) == len(cfg.reward.functions),
         "reward.weights must have one weight per entry of reward.functions"),
        (cfg.data.num_train_prompts >= 1, "data.num_train_prompts must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as a nested plain dict (for YAML/JSON dumps)."""
    return dataclasses.asdict(cfg)


def field_help() -> list[tuple[str, Any, str]]:
    """(key, default, help) for every config key, for `--help-config`."""
    rows = []
    default = Config()
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            rows.append((f"{section}.{f.name}", getattr(getattr(default, section), f.name), f.metadata.get("help", "")))
    return rows
