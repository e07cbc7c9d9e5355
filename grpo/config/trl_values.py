"""The types of TRL keys' values, checked before they are mapped (grpo/config/trl.py).

:func:`check_values` gives each TRL key's value in the type TRL's argument parser gives it (booleans as
its `string_to_bool` reads them, numbers from numeric strings, JSON objects from strings) or raises one
ConfigError naming the key as the user wrote it and the bad value, so no value reaches the mapping (and no
division by zero or `int('abc')`) unchecked. Keys not listed here are taken as they are.

The ``*_value`` functions then turn one checked value into ours (scale_rewards, lr_scheduler_type, dtype,
report_to); grpo/config/trl.py's TRL_KEYS names them.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from grpo.config.errors import ConfigError

#: TRL's boolean keys (`string_to_bool`: yes/no, true/false, t/f, y/n, 1/0, any case).
BOOL_KEYS = frozenset((
    "shuffle_dataset", "mask_truncated_completions", "use_bias_correction_kl", "gradient_checkpointing",
    "disable_dropout", "use_adaptive_entropy", "disable_tqdm", "trust_remote_code", "use_peft", "sync_ref_model",
    "bf16", "fp16", "vllm_importance_sampling_correction", "logging_first_step", "log_completions", "use_vllm",
    "do_eval", "ds3_gather_for_generation", "vllm_enable_sleep_mode", "use_transformers_paged",
    "use_transformers_continuous_batching", "log_unique_prompts", "log_multimodal", "dataset_streaming",
    "push_to_hub", "overwrite_output_dir", "gradient_checkpointing_use_reentrant", "use_cpu", "use_rslora", "use_dora",
    "load_in_4bit", "load_in_8bit", "use_bnb_nested_quant", "remove_unused_columns", "dataloader_drop_last",
    "dataloader_pin_memory", "dataloader_persistent_workers", "cast_lm_head_to_fp32"))
#: Booleans TRL defaults to true, so its parser also takes `--no_KEY` (= false).
NEGATABLE = frozenset(("shuffle_dataset", "gradient_checkpointing", "use_bias_correction_kl",
                       "vllm_importance_sampling_correction", "ds3_gather_for_generation"))
#: TRL's integer keys -> the least value that means something (None: any integer).
INT_KEYS = {"num_generations": 1, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
            "steps_per_generation": 1, "generation_batch_size": 1, "num_iterations": 1, "max_completion_length": 1,
            "max_prompt_length": 1, "top_k": 0, "seed": 0, "save_total_limit": 0, "ref_model_sync_steps": 1,
            "lora_r": 1, "lora_alpha": 1, "max_tool_calling_iterations": 1, "max_steps": None, "data_seed": 0,
            "num_generations_eval": 1, "dataloader_num_workers": 0, "dataloader_prefetch_factor": 1,
            "vllm_tensor_parallel_size": 1, "vllm_server_port": 1, "vllm_group_port": 1, "vllm_max_model_length": 1}
#: TRL's keys that are floats (a whole number or a fraction of the run for the *_steps ones).
FLOAT_KEYS = frozenset((
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm", "temperature", "top_p", "min_p",
    "repetition_penalty", "beta", "epsilon", "epsilon_high", "delta", "sapo_temperature_pos", "sapo_temperature_neg",
    "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "top_entropy_quantile",
    "off_policy_mask_threshold", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max", "ref_model_mixup_alpha", "entropy_coef", "entropy_target",
    "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max", "lora_dropout", "warmup_ratio", "warmup_steps",
    "num_train_epochs", "save_steps", "eval_steps", "router_aux_loss_coef", "vllm_gpu_memory_utilization",
    "vllm_server_timeout"))
#: TRL's string keys (a number written for one is taken as its text, as TRL's parser does).
STR_KEYS = frozenset((
    "output_dir", "run_name", "model_name_or_path", "dataset_name", "dataset_train_split", "dataset_test_split",
    "dataset_config", "attn_implementation", "importance_sampling_level", "vllm_importance_sampling_mode",
    "lr_scheduler_type", "loss_type", "save_strategy", "eval_strategy", "multi_objective_aggregation", "dtype",
    "torch_dtype", "reward_model_name_or_path", "model_revision", "lora_task_type", "optim", "bnb_4bit_quant_type",
    "bnb_4bit_quant_storage", "vllm_structured_outputs_regex", "vllm_mode", "vllm_model_impl", "vllm_server_base_url",
    "vllm_server_host", "cache_implementation"))
#: TRL's list keys (`nargs='+'` on its command line) -> the type of their items; one value = a list of one.
LIST_KEYS = {"reward_funcs": str, "report_to": str, "lora_target_modules": str, "reward_weights": float,
             "lora_modules_to_save": str, "lora_target_parameters": str}
#: TRL's dict keys (a JSON object string too, as TRL reads them).
DICT_KEYS = frozenset(("generation_kwargs", "model_init_kwargs", "chat_template_kwargs",
                       "gradient_checkpointing_kwargs"))
#: Keys TRL lets be None (null in YAML, `none` on its command line).
NONE_OK = frozenset((
    "steps_per_generation", "generation_batch_size", "max_prompt_length", "top_k", "save_total_limit",
    "max_tool_calling_iterations", "min_p", "epsilon_high", "delta", "vllm_importance_sampling_cap",
    "off_policy_mask_threshold", "eval_steps", "output_dir", "run_name", "model_name_or_path", "dataset_name",
    "dataset_config", "attn_implementation", "dtype", "torch_dtype", "reward_model_name_or_path", "model_revision",
    "reward_funcs", "report_to", "lora_target_modules", "reward_weights", "bf16", "disable_tqdm",
    "multi_objective_aggregation", "max_steps", "num_train_epochs", "warmup_ratio", "data_seed", "num_generations_eval",
    "router_aux_loss_coef", "lora_modules_to_save", "lora_target_parameters", "bnb_4bit_quant_storage",
    "vllm_structured_outputs_regex", "dataloader_prefetch_factor", "pad_to_multiple_of", "vllm_server_base_url",
    "vllm_max_model_length", "cache_implementation", "transformers_continuous_batching_config")) | DICT_KEYS


#: transformers' optimizer names grpo honours (its AdamW; fused is an implementation of the same update).
ADAMW = ("adamw_torch", "adamw_torch_fused")

#: TRL keys accepted with a note at the value given (TRL's default, mostly), an error naming them otherwise:
#: key -> (is the value accepted?, the note, the error).
IF_DEFAULT: dict[str, tuple[Callable[[Any, dict], bool], str, str]] = {
    "model_revision": (lambda v, t: v in (None, "main"), "models load from a local directory",
                       "grpo loads local model directories: save revision '{v}' to one and name it in "
                       "model_name_or_path"),
    "dataset_config": (lambda v, t: v is None, "datasets are local files",
                       "grpo reads local files and save_to_disk directories, not hub configurations: save "
                       "configuration '{v}' to one and name it in dataset_name"),
    "dataset_test_split": (lambda v, t: True, "evaluation reads data.eval_dataset, held-out prompts of their own", ""),
    "dataset_streaming": (lambda v, t: not v, "the dataset is read whole", "no streaming here: set it false"),
    "lora_task_type": (lambda v, t: v == "CAUSAL_LM", "grpo trains causal LMs",
                       "'{v}': grpo trains causal LMs (CAUSAL_LM)"),
    "push_to_hub": (lambda v, t: not v, "nothing is pushed",
                    "no hub uploads here: set it false and push the saved checkpoint yourself"),
    "gradient_checkpointing_use_reentrant": (lambda v, t: True, "grpo's checkpointing is non-reentrant, same values",
                                             ""),
    "gradient_checkpointing_kwargs": (lambda v, t: True, "grpo's checkpointing is non-reentrant, same values", ""),
    # reached with max_steps > 0 only (from_trl maps epochs to train.num_train_epochs otherwise)
    "num_train_epochs": (lambda v, t: True, "max_steps is set, and TRL ignores num_train_epochs then", ""),
    # transformers' optimizer name (our `optim` section when it is a mapping)
    "optim": (lambda v, t: v in ADAMW, "transformers' optimizer name: grpo's AdamW (torch.optim.AdamW) is the same "
              "update", "'{v}' is transformers' optimizer name (TRL's optim key): grpo trains with AdamW only ("
              + ", ".join(ADAMW) + "); grpo's own optim section is a mapping (optim: {{lr: ...}})"),
    # ModelConfig's LoRA and quantization switches at their defaults
    "use_rslora": (lambda v, t: not v, "LoRA scales by lora_alpha / r", "rank-stabilised LoRA is not implemented "
                   "here (grpo's LoRA scales by lora_alpha / r): set it false"),
    "use_dora": (lambda v, t: not v, "plain LoRA", "DoRA is not implemented here: set it false"),
    "lora_modules_to_save": (lambda v, t: not v, "only the adapters train", "grpo's LoRA trains the adapters only "
                             "(no fully trained modules beside them, {v}): remove it"),
    "lora_target_parameters": (lambda v, t: not v, "adapters go on modules", "adapters on parameters ({v}) are not "
                               "implemented here: name modules in lora_target_modules"),
    **dict.fromkeys(("load_in_4bit", "load_in_8bit"), (
        lambda v, t: not v, "weights load unquantized", "no quantized (bitsandbytes) loading here: set it false")),
    **dict.fromkeys(("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"), (
        lambda v, t: True, "read only with load_in_4bit", "")),
    # TrainingArguments / GRPOConfig switches grpo has no counterpart for, at their defaults
    "remove_unused_columns": (lambda v, t: not v, "every dataset column reaches the reward functions",
                              "grpo passes every dataset column to the reward functions (TRL's default, false): "
                              "set it false"),
    "data_seed": (lambda v, t: v is None, "the prompt order follows seed", "grpo shuffles the prompts with seed "
                  "(train.seed); a separate data_seed ({v}) is not supported: remove it"),
    "dataloader_drop_last": (lambda v, t: not v, "no DataLoader here", "grpo has no DataLoader whose last batch it "
                             "could drop: set it false"),
    **dict.fromkeys(("dataloader_pin_memory", "dataloader_num_workers", "dataloader_persistent_workers",
                     "dataloader_prefetch_factor"), (lambda v, t: True, "no DataLoader here", "")),
    "num_generations_eval": (lambda v, t: v is None, "evaluation decodes one greedy completion per prompt",
                             "{v}: grpo's evaluation decodes one greedy completion per prompt (train.eval_steps): "
                             "remove it"),
    "cast_lm_head_to_fp32": (lambda v, t: not v, "the LM head keeps model.dtype", "no fp32 LM-head cast here "
                             "(train.precision autocasts with fp32 master weights): set it false"),
    "router_aux_loss_coef": (lambda v, t: v is None, "no MoE router auxiliary loss is added here", "{v}: the MoE "
                             "router's auxiliary loss is not added here: remove it"),
    "vllm_structured_outputs_regex": (lambda v, t: v is None, "generation is unconstrained", "'{v}': grpo's engines "
                                      "do not constrain generation by a regex: remove it"),
}


def to_bool(value: Any, name: str) -> bool:
    """A TRL boolean: a bool, 1 / 0, or yes/no, true/false, t/f, y/n, 1/0 in any case (TRL's string_to_bool)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).lower() if isinstance(value, (str, int, float)) else None
    if text in ("yes", "true", "t", "y", "1"):
        return True
    if text in ("no", "false", "f", "n", "0"):
        return False
    raise ConfigError(f"{name} expects true or false (yes/no, t/f, y/n, 1/0), got {value!r}")


def _number(value: Any, name: str, kind: type) -> Any:
    if isinstance(value, str):
        try:
            value = kind(value.strip())
        except ValueError:
            try:
                value = float(value.strip())
            except ValueError:
                pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} expects {'an integer' if kind is int else 'a number'}, got {value!r}")
    if kind is int:
        if value != int(value):
            raise ConfigError(f"{name} expects an integer, got {value!r}")
        return int(value)
    return value


def _dict(value: Any, name: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if not isinstance(value, dict):
        raise ConfigError(f"{name} expects a mapping (a JSON object such as '{{\"temperature\": 0.7}}'), got {value!r}")
    return value


def _list(value: Any, name: str, item: type) -> list:
    items = value if isinstance(value, (list, tuple)) else [value]
    if item is float:
        return [_number(v, f"{name} (entry {v!r})", float) for v in items]
    bad = [v for v in items if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"{name} expects a name or a list of names, got {value!r}")
    return [str(v) for v in items]


def check_value(key: str, value: Any, name: str | None = None) -> Any:
    """TRL key `key`'s value in its TRL type; errors say `name` (default: TRL key 'key') and the value."""
    name = name or f"TRL key '{key}'"
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and key not in STR_KEYS
                         and key not in ("report_to", "scale_rewards")):
        if key in NONE_OK:
            return None
        raise ConfigError(f"{name} needs a value, got {value!r}")
    if key in BOOL_KEYS:
        value = to_bool(value, name)
    elif key in INT_KEYS:
        number = _number(value, name, int)
        least = INT_KEYS[key]
        if least is not None and number < least:
            raise ConfigError(f"{name} must be >= {least}, got {number}")
        value = number
    elif key in FLOAT_KEYS:
        number = _number(value, name, float)
        value = int(number) if number == int(number) and key.endswith("_steps") else number
    elif key in STR_KEYS:
        if isinstance(value, (dict, list, bool)):
            raise ConfigError(f"{name} expects a string, got {value!r}")
        value = str(value)
    elif key in LIST_KEYS:
        value = _list(value, name, LIST_KEYS[key])
    elif key in DICT_KEYS:
        value = _dict(value, name)
    if key in IF_DEFAULT and key != "num_train_epochs" and not IF_DEFAULT[key][0](value, {}):
        raise ConfigError(f"{name}: " + IF_DEFAULT[key][2].format(v=value))      # (epochs: see max_steps)
    return value


def check_values(trl: dict[str, Any], where: str = "") -> dict[str, Any]:
    """Every TRL key's value checked (:func:`check_value`); `where` (e.g. 'recipe.yaml: ') prefixes the errors."""
    return {k: check_value(k, v, f"{where}TRL key '{k}'") for k, v in trl.items()}


# ---------------------------------------------------------------- one TRL value -> ours (used by trl.TRL_KEYS)


def same_value(value: Any) -> Any:
    return value


def scale_rewards_value(value: Any) -> str:
    """TRL scale_rewards: True = group, False = none, or the string itself (group | batch | none)."""
    value = {"true": True, "false": False}.get(str(value).lower(), value)
    if isinstance(value, bool):
        return "group" if value else "none"
    if value not in ("group", "batch", "none"):
        raise ConfigError(f"TRL key 'scale_rewards': {value!r} has no equivalent here (group, batch, none, true, false)")
    return value


def lr_scheduler_value(value: Any) -> str:
    table = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"}
    if value not in table:
        raise ConfigError(f"TRL key 'lr_scheduler_type': '{value}' has no equivalent here (known: {', '.join(table)})")
    return table[value]


def dtype_value(value: Any) -> str:
    """TRL ModelConfig dtype / torch_dtype -> model.dtype ('auto' = the checkpoint's: no equivalent here)."""
    names = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
             "float16": "float16", "fp16": "float16"}
    if str(value) not in names:
        raise ConfigError(f"TRL key 'dtype': '{value}' has no equivalent here; set float32, bfloat16 or float16")
    return names[str(value)]


def report_to_value(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    return [v for v in names if v != "none"]


# ---------------------------------------------------------------- TRL dict keys -> ours (used by trl.from_trl)


#: model_init_kwargs entries -> our model keys (the rest have no equivalent: errors naming them).
MODEL_INIT_KEYS = {"dtype": "model.dtype", "torch_dtype": "model.dtype", "attn_implementation": "model.attn_implementation",
                   "trust_remote_code": "model.trust_remote_code"}


#: generation_kwargs entries (vLLM SamplingParams' / transformers GenerationConfig's names) -> (our rollout key, the
#: TRL key whose type and meaning the value has).
GENERATION_KEYS = {"temperature": ("rollout.temperature", "temperature"), "top_p": ("rollout.top_p", "top_p"),
                   "top_k": ("rollout.top_k", "top_k"), "min_p": ("rollout.min_p", "min_p"),
                   "repetition_penalty": ("rollout.repetition_penalty", "repetition_penalty"),
                   "max_new_tokens": ("rollout.max_new_tokens", "max_completion_length"),
                   "max_tokens": ("rollout.max_new_tokens", "max_completion_length")}


def generation_overrides(trl: dict[str, Any]) -> dict[str, Any]:
    """generation_kwargs (TRL: extra sampling arguments to vLLM's SamplingParams or transformers' GenerationConfig,
    overriding TRL's own keys, as they do here) -> rollout.* keys; an argument grpo has no key for is an error."""
    kwargs = trl.get("generation_kwargs") or {}
    unknown = [k for k in kwargs if k not in GENERATION_KEYS]
    if unknown:
        raise ConfigError(f"TRL key generation_kwargs: {', '.join(map(str, unknown))} has no equivalent here (known: "
                          f"{', '.join(GENERATION_KEYS)})")
    out = {}
    for key, value in kwargs.items():
        ours, like = GENERATION_KEYS[key]
        value = check_value(like, value, f"TRL key generation_kwargs['{key}']")
        out[ours] = 0 if value is None else value          # top_k / min_p None: off (as TRL's keys)
    return out


def model_init_overrides(trl: dict[str, Any]) -> dict[str, Any]:
    """model_init_kwargs (TRL: from_pretrained's arguments when the model is given by name) -> model.* keys;
    vllm_importance_sampling_correction false -> no rollout correction (true: the mode's own setting)."""
    out = {}
    if trl.get("vllm_importance_sampling_correction") is False:
        out["algorithm.rollout_correction"] = "none"
    kwargs = trl.get("model_init_kwargs") or {}
    unknown = [k for k in kwargs if k not in MODEL_INIT_KEYS]
    if unknown:
        raise ConfigError(f"TRL key model_init_kwargs: {', '.join(unknown)} has no equivalent here (known: "
                          f"{', '.join(MODEL_INIT_KEYS)})")
    for key, value in kwargs.items():
        out[MODEL_INIT_KEYS[key]] = dtype_value(value) if MODEL_INIT_KEYS[key] == "model.dtype" else value
    return out
