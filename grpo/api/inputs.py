"""What a user hands the Python API, turned into what the loop works on.

Each resolver takes the forms the API accepts for one argument and returns one kind of object, or
raises a one-line error naming the argument or config key at fault:

* :func:`resolve_config`: our Config, a nested dict, flat `section.key` keys, TRL GRPOConfig keys, a YAML path;
* :func:`resolve_rewards`: callables (sync or async, TRL's keyword signature), built-in names,
  `file.py:fn`, reward-model directories, `(fn, weight)` / `(name, fn)` / `(name, fn, weight)` tuples;
* :func:`resolve_dataset`: a path, a `datasets.Dataset` / `DatasetDict`, a list of dicts, a dict of columns;
* :func:`resolve_model`: a local path, a loaded `PreTrainedModel` or a peft model (dtype, LoRA,
  attention kernel and device applied), and its tokenizer.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any

import torch

from grpo.config import SECTIONS, Config, ConfigError, build_config, load_yaml, to_dict
from grpo.data.datasets_io import DataError, Records, records_from_rows

#: TRL mappings already printed by this process (each distinct one is printed once).
_PRINTED: set[str] = set()


# ---------------------------------------------------------------- config


def split_keys(flat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A user's dict as (nested sections, our flat `section.key` overrides, TRL keys)."""
    from grpo.config.trl import is_trl_key, is_trl_name

    nested, ours, trl = {}, {}, {}
    for key, value in flat.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r}")
        if (key in SECTIONS and (isinstance(value, dict) or not is_trl_key(key))     # `optim: adamw_torch`: TRL's
                or ("." not in key and isinstance(value, dict) and not is_trl_name(key))):   # a misspelt section
            # (a mapping under a TRL / TrainingArguments name, lr_scheduler_kwargs: {...}, is a TRL key)
            nested[key] = value
        elif "." in key:
            ours[key] = value
        else:
            trl[key] = value
    return nested, ours, trl


def changed_fields(obj: Any) -> dict[str, Any]:
    """The fields of a dataclass object (e.g. peft's LoraConfig) that differ from their declared defaults: the
    keys the user set. (A TRL GRPOConfig object: grpo.config.trl_object.trl_fields.)"""
    out = {}
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        value = getattr(obj, f.name)
        if default is dataclasses.MISSING or value != default:
            out[f.name] = value
    return out


def resolve_config(config: Any = None, overrides: dict[str, Any] | None = None, world_size: int = 1) -> Config:
    """A Config from: None (defaults), a Config, a YAML path, or a dict mixing sections
    ({"train": {...}}), `section.key` keys and TRL GRPOConfig keys (mapped by grpo.config.trl; the
    mapping is printed once). `overrides` (`section.key`) are applied last."""
    from grpo.config.trl import from_trl

    overrides = dict(overrides or {})
    if config is None:
        return build_config(None, overrides)
    if isinstance(config, Config):
        return build_config(to_dict(config), overrides) if overrides else config
    if isinstance(config, (str, Path)):       # a YAML file: sections, section.key and TRL keys, as a dict
        config = load_yaml(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):   # TRL's GRPOConfig: TRL's defaults apply
        from grpo.config.trl_object import trl_fields

        changed: set[str] | None = set()
        config = trl_fields(config, changed)
    else:
        changed = None
    if not isinstance(config, dict):
        raise ConfigError(f"config must be a grpo Config, a dict or a YAML path, got {type(config).__name__} (for a "
                          f"TRL GRPOConfig-style config pass a dict of the keys you set: config={{'learning_rate': 1e-6, ...}})")
    nested, ours, trl = split_keys(config)
    mapped, lines = from_trl(trl, world_size)
    if changed is not None:
        from grpo.config.trl_object import object_lines

        lines = object_lines(lines, changed)
    if lines:
        message = "grpo: TRL keys mapped: " + "; ".join(lines)
        if message not in _PRINTED:
            _PRINTED.add(message)
            print(message, file=sys.stderr)
    merged = {**mapped, **ours, **overrides}
    if "lora.target_modules" in merged and merged["lora.target_modules"] is None:   # TRL's lora_target_modules None
        merged["lora.target_modules"] = _peft_default_targets(build_config(nested, {**merged,
                                                                                    "lora.target_modules": ["x"]}))
    return build_config(nested, merged)


def _peft_default_targets(cfg: Config) -> list[str]:
    """TRL's `lora_target_modules: null` (use_peft's default): peft's default modules for the model type of
    model.path, as get_peft_model picks them (grpo's own default is all-linear); `peft-default` (resolved by peft
    from the model itself) when model.path names no model directory: a model object, the embedded policy."""
    if not cfg.lora.enabled:
        return list(build_config().lora.target_modules)     # no LoRA: the key changes nothing
    import json

    config_json = Path(cfg.model.path) / "config.json" if cfg.model.path else None
    if config_json is None or not config_json.is_file():      # a model object, the embedded one: known later
        return ["peft-default"]                               # peft picks by the model's type when LoRA is applied
    model_type = json.loads(config_json.read_text()).get("model_type")
    return peft_default_targets(model_type, "TRL key lora_target_modules: null")


def peft_default_targets(model_type: str | None, what: str) -> list[str]:
    """peft's default LoRA target modules for `model_type` (what get_peft_model picks for target_modules None)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if model_type not in DEFAULTS:
        raise ConfigError(f"{what}: peft has no default target modules for model type {model_type!r}: name the "
                          f"modules (or 'all-linear')")
    targets = DEFAULTS[model_type]
    return [targets] if isinstance(targets, str) else sorted(targets)


#: peft LoraConfig fields -> our keys (TRL's ``peft_config=``), and the fields that change nothing here.
PEFT_KEYS = {"r": "lora.r", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
             "target_modules": "lora.target_modules"}
PEFT_NO_EFFECT = {"peft_type", "peft_version", "task_type", "inference_mode", "base_model_name_or_path", "revision",
                  "fan_in_fan_out"}


def peft_overrides(peft_config: Any, model_type: str | None) -> dict[str, Any]:
    """Our `lora.*` keys for a peft ``LoraConfig`` passed as TRL's ``peft_config=``: r, lora_alpha, lora_dropout
    and target_modules (None: peft's default for `model_type`, as get_peft_model picks it). Any other field
    set away from peft's default is an error naming it."""
    if type(peft_config).__name__ != "LoraConfig" or not dataclasses.is_dataclass(peft_config):
        raise ConfigError(f"peft_config must be a peft LoraConfig (the only adapter type here), got "
                          f"{type(peft_config).__name__}")
    if getattr(peft_config, "task_type", None) not in (None, "CAUSAL_LM"):
        raise ConfigError(f"peft_config.task_type {peft_config.task_type!s}: grpo trains causal LMs (CAUSAL_LM)")
    other = sorted(k for k in changed_fields(peft_config) if k not in PEFT_KEYS and k not in PEFT_NO_EFFECT)
    if other:
        raise ConfigError(f"peft_config fields with no equivalent here: {', '.join(other)} (grpo's LoRA takes r, "
                          f"lora_alpha, lora_dropout and target_modules)")
    targets = peft_config.target_modules
    if targets is None:
        targets = peft_default_targets(model_type, "peft_config.target_modules is None")
    return {"lora.enabled": True, "lora.r": peft_config.r, "lora.alpha": peft_config.lora_alpha,
            "lora.dropout": peft_config.lora_dropout,
            "lora.target_modules": [targets] if isinstance(targets, str) else sorted(targets)}


# ---------------------------------------------------------------- rewards


def reward_name(fn: Any) -> str:
    """A reward callable's metric name: its __name__ (functools.partial: the wrapped function's), else its class."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def _one_reward(item: Any, index: int, tokenizer: Any = None) -> tuple[str, Any, float | None]:
    """(name, function, weight or None) of one reward_funcs entry; `tokenizer`: a reward model's (TRL's
    reward_processing_classes entry)."""
    from grpo.rewards import load_reward
    from grpo.rewards.reward_model import is_reward_model, wrap_reward_model
    from grpo.rewards.verl import adapt_reward

    weight = None
    if isinstance(item, tuple):
        if len(item) == 3 and isinstance(item[0], str):
            name, fn, weight = item
            return name, _one_reward(fn, index, tokenizer)[1], float(weight)
        if len(item) == 2 and isinstance(item[0], str) and callable(item[1]):
            return (*adapt_reward(item[0], item[1]), None)      # a verl compute_score: wrapped
        if len(item) == 2 and isinstance(item[1], (int, float)) and not isinstance(item[1], bool):
            name, fn, _ = _one_reward(item[0], index, tokenizer)
            return name, fn, float(item[1])
        raise TypeError(f"reward_funcs[{index}]: a tuple must be (fn, weight), (name, fn) or (name, fn, weight)")
    if isinstance(item, (str, Path)):
        name, fn = load_reward(str(item))
        return name, fn, None
    if is_reward_model(item):                          # a loaded sequence classifier, as TRL takes it
        name, fn = wrap_reward_model(item, tokenizer)
        return name, fn, None
    if callable(item):
        return (*adapt_reward(reward_name(item), item), None)
    raise TypeError(f"reward_funcs[{index}] must be a callable, a reward name/spec or a (fn, weight) tuple, "
                    f"got {type(item).__name__}")


#: reward weights given both ways (F-5: not a count error when the counts match).
WEIGHTS_TWICE = ("reward weights given twice: as (fn, weight) tuples in reward_funcs and as reward.weights (TRL: "
                 "reward_weights) in the config; give them one way")


def reward_entries(reward_funcs: Any) -> list:
    """The entries of `reward_funcs`, one per reward function (a lone callable or tuple is one entry)."""
    items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) and not (
        isinstance(reward_funcs, tuple) and len(reward_funcs) in (2, 3) and not callable(reward_funcs[-1])
        and isinstance(reward_funcs[-1], (int, float))) else [reward_funcs]
    if not items:
        raise ConfigError("reward_funcs is empty: give at least one reward function")
    return items


def config_for_rewards(config: Any, reward_funcs: Any, world_size: int = 1) -> tuple[Config, Any]:
    """The config of `config` with reward_funcs (when given) in the place of ``reward.functions``, so that
    ``reward.weights`` (TRL's reward_weights) count against reward_funcs; and the config's weights: None, a list,
    or the ConfigError of weights that do not fit (for :func:`resolve_rewards` to report)."""
    if reward_funcs is None:
        cfg = resolve_config(config, world_size=world_size)
        return cfg, cfg.reward.weights
    slots = {"reward.functions": [f"reward_funcs[{i}]" for i in range(len(reward_entries(reward_funcs)))]}
    cfg = resolve_config(config, {**slots, "reward.weights": None}, world_size=world_size)
    try:
        return cfg, resolve_config(config, slots, world_size=world_size).reward.weights
    except ConfigError as e:                      # everything else passed above: the weights do not fit
        return cfg, ConfigError(f"{e} (with reward_funcs given, reward.functions are its "
                                f"{len(slots['reward.functions'])} entries)")


_FROM_CONFIG = object()


def resolve_rewards(reward_funcs: Any, cfg: Config, processing_classes: Any = None, config_weights: Any = _FROM_CONFIG
                    ) -> tuple[list[tuple[str, Any]], list[float] | None]:
    """The (name, fn) pairs and weights of `reward_funcs` (None: `reward.functions` of the config);
    `processing_classes` (TRL's reward_processing_classes): the reward models' tokenizers, one per entry
    (or one for a single entry), None where not needed. `config_weights`: the config's reward.weights as
    :func:`config_for_rewards` gives them (default: ``cfg.reward.weights``)."""
    from grpo.rewards import load_reward

    if config_weights is _FROM_CONFIG:
        config_weights = cfg.reward.weights
    if reward_funcs is None:
        return [load_reward(spec) for spec in cfg.reward.functions], config_weights
    items = reward_entries(reward_funcs)
    tokenizers = (list(processing_classes) if isinstance(processing_classes, (list, tuple))
                  else [processing_classes] * len(items))
    if len(tokenizers) != len(items):
        raise ConfigError(f"reward_processing_classes has {len(tokenizers)} entries for {len(items)} reward_funcs")
    resolved = [_one_reward(item, i, tok) for i, (item, tok) in enumerate(zip(items, tokenizers))]
    names = [name for name, _, _ in resolved]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ConfigError(f"two reward functions are named '{duplicate}': name one with a (name, fn) tuple")
    given = [w for _, _, w in resolved]
    if any(w is not None for w in given) and config_weights is not None:
        raise ConfigError(WEIGHTS_TWICE)
    if isinstance(config_weights, ConfigError):
        raise config_weights
    if all(w is None for w in given):
        weights = config_weights
        if weights is not None and len(weights) != len(resolved):
            raise ConfigError(f"reward.weights has {len(weights)} weights for {len(resolved)} reward_funcs")
    else:
        weights = [1.0 if w is None else w for w in given]
    return [(name, fn) for name, fn, _ in resolved], weights


# ---------------------------------------------------------------- datasets


def resolve_dataset(dataset: Any, split: str, what: str = "train_dataset") -> tuple[Records | None, str | None]:
    """(in-memory records, or None) and (a dataset path for `data.dataset`, or None)."""
    if dataset is None:
        return None, None
    if isinstance(dataset, (str, Path)):
        return None, str(dataset)
    kind = type(dataset).__name__
    if kind == "DatasetDict" or (isinstance(dataset, dict) and dataset and all(
            type(v).__name__ == "Dataset" for v in dataset.values())):
        if split not in dataset:
            raise DataError(f"{what}: no split '{split}' (data.split); splits: {', '.join(dataset)}")
        return records_from_rows(dataset[split].to_list(), f"{what}[{split}]"), None
    if kind == "IterableDataset":
        raise DataError(f"{what}: an IterableDataset is read through stream_rows(), which needs the config")
    if hasattr(dataset, "to_list") and hasattr(dataset, "column_names"):   # datasets.Dataset
        return records_from_rows(dataset.to_list(), what), None
    if isinstance(dataset, dict):                                          # a dict of columns
        lengths = {len(v) for v in dataset.values() if isinstance(v, (list, tuple))}
        if len(lengths) != 1 or not all(isinstance(v, (list, tuple)) for v in dataset.values()):
            raise DataError(f"{what}: a dict dataset must map column names to lists of one length")
        n = lengths.pop()
        return records_from_rows([{k: v[i] for k, v in dataset.items()} for i in range(n)], what), None
    if isinstance(dataset, (list, tuple)):
        return records_from_rows(dataset, what), None
    raise DataError(f"{what} must be a path, a datasets.Dataset, a list of dicts or a dict of columns, got {kind}")


# ---------------------------------------------------------------- models


def _tokenizer_for(model: torch.nn.Module, tokenizer: Any, trust_remote_code: bool):
    """The tokenizer given (object or directory), else the one saved beside the model's weights."""
    from grpo.modeling.models import load_tokenizer, prepare_tokenizer

    if isinstance(tokenizer, (str, Path)):
        return load_tokenizer(Path(tokenizer), trust_remote_code)
    if tokenizer is not None:
        return prepare_tokenizer(tokenizer, type(tokenizer).__name__)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    source = getattr(inner, "name_or_path", None) or getattr(getattr(inner, "config", None), "_name_or_path", None)
    if source and Path(source).is_dir():
        return load_tokenizer(Path(source), trust_remote_code)
    raise ValueError("tokenizer=: the model object has no local directory to load its tokenizer from; pass tokenizer=")


def cast_dtype(model: torch.nn.Module, dtype_name: str) -> None:
    """`model.dtype` applied to a model object (floating parameters only; others are an error naming the key)."""
    from grpo.modeling.models import resolve_dtype

    dtype = resolve_dtype(dtype_name)
    kinds = {p.dtype for p in model.parameters()}
    if any(not k.is_floating_point for k in kinds):
        raise ConfigError(f"model.dtype={dtype_name}: the model has non-floating parameters "
                          f"({sorted(str(k) for k in kinds if not k.is_floating_point)[0]}, quantized?) and cannot be cast")
    if kinds != {dtype}:
        model.to(dtype)


def resolve_model(model: Any, tokenizer: Any, cfg: Config, runtime) -> tuple[torch.nn.Module, Any]:
    """The policy (dtype, LoRA and attention kernel applied; placed by `runtime`, which also applies
    `train.lean_layers`) and its tokenizer."""
    from grpo.modeling.lora import apply_lora, is_lora
    from grpo.modeling.models import (EMBEDDED_MODEL_DIR, align_special_tokens, disable_dropout, load_policy,
                                      resolve_dtype)
    from grpo.training.runtime import attn_implementation, set_attn_implementation

    mc = cfg.model
    if model is None or isinstance(model, (str, Path)):
        path = str(model) if model is not None else (mc.path or str(EMBEDDED_MODEL_DIR))
        kernel = attn_implementation(mc.attn_implementation, runtime.device, resolve_dtype(mc.dtype))
        try:
            model, loaded_tok = load_policy(path, dtype=mc.dtype, trust_remote_code=mc.trust_remote_code,
                                            attn_implementation=kernel)
        except (ValueError, OSError):
            raise
        except Exception as e:  # e.g. safetensors' error for a torn weights file: one line naming the directory
            raise ValueError(f"cannot load a causal LM from {path}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0]}") from e
        tokenizer = loaded_tok if tokenizer is None else _tokenizer_for(model, tokenizer, mc.trust_remote_code)
    elif isinstance(model, torch.nn.Module):
        tokenizer = _tokenizer_for(model, tokenizer, mc.trust_remote_code)
        cast_dtype(model, mc.dtype)
        set_attn_implementation(model, mc.attn_implementation, runtime.device)
        align_special_tokens(model, tokenizer) if hasattr(model, "generation_config") else None
    else:
        raise TypeError(f"model must be a local model directory or a torch.nn.Module (PreTrainedModel / peft "
                        f"model), got {type(model).__name__}")
    if cfg.lora.enabled:
        if is_lora(model):
            raise ConfigError("lora.enabled: the model already has LoRA adapters (a peft model); its adapters are "
                              "trained as they are: set lora.enabled false")
        model = apply_lora(model, cfg.lora)
    if cfg.train.disable_dropout:
        disable_dropout(model)
    model = runtime.place(model)        # CPU: which linears run through oneDNN (cpu.cpu_matmul), lean layers (auto)
    return model, tokenizer

