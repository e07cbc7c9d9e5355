"""TRL `GRPOConfig` keys -> our config keys, for configs written for Hugging Face TRL.

:func:`from_trl` turns a flat dict of TRL keys into our `section.key` overrides. Every key in
:data:`TRL_KEYS` maps to one of ours, with the value converted where the vocabularies differ
(`scale_rewards`, `lr_scheduler_type`, `report_to`, `bf16`/`fp16`). A few TRL keys combine into some
of ours (:data:`BATCH_KEYS`, :data:`REF_SYNC_KEYS`, :data:`REWARD_KEYS`, `loss_type`: :data:`LOSS_TYPES`). The model,
dataset and reward keys of TRL's ModelConfig and `trl grpo` script arguments (`model_name_or_path`,
`dtype`, `use_peft`, `lora_r`, `dataset_name`, `reward_funcs`, ...) map too, so a `trl grpo --config`
file is read as it is, and so do the generation-backend keys (`use_vllm`, `vllm_*`: grpo/config/trl_vllm.py).
Keys that change nothing here (:data:`NO_EFFECT`: logging cadence, `vllm_group_port`) are accepted with a note,
and so are recipe keys at TRL's default (:data:`IF_DEFAULT`: `model_revision: main`, `push_to_hub: false`, ...;
another value is an error); any other TRL key is an error that names it.
Values are first checked and converted as TRL's parser reads them (grpo/config/trl_values.py): a bad one is an
error naming the key and the value. Of a dict or recipe only the keys given are mapped: TRL's defaults are not
ours (TRL's beta is 0.0, ours 0.04; docs/migrating-from-trl.md lists every default that differs). A GRPOConfig
object carries TRL's defaults: grpo/config/trl_object.py gives them for the mapped training keys. What TRL does
with keys left out of a dict (use_peft's LoRA defaults, `constant` ignoring warm-up) follows :func:`_as_trl_does`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

from grpo.config.errors import ConfigError
from grpo.config.names import did_you_mean
from grpo.config.schema import SECTIONS
from grpo.config.trl_values import (IF_DEFAULT, check_values, dtype_value, generation_overrides, lr_scheduler_value,
                                     model_init_overrides, report_to_value, same_value, scale_rewards_value)
from grpo.config.trl_vllm import ENGINE_NOTES, VLLM_KEYS, engine_overrides
from grpo.config.variants import fold_translated


#: TRL key -> (our key, value conversion).
TRL_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "learning_rate": ("optim.lr", same_value),
    "weight_decay": ("optim.weight_decay", same_value),
    "adam_beta1": ("optim.adam_beta1", same_value),
    "adam_beta2": ("optim.adam_beta2", same_value),
    "max_grad_norm": ("optim.max_grad_norm", same_value),
    "lr_scheduler_type": ("optim.lr_scheduler", lr_scheduler_value),
    "num_generations": ("rollout.num_generations", same_value),
    "max_completion_length": ("rollout.max_new_tokens", same_value),
    "temperature": ("rollout.temperature", same_value),
    "top_p": ("rollout.top_p", same_value),
    "top_k": ("rollout.top_k", lambda v: 0 if v is None else v),
    "min_p": ("rollout.min_p", lambda v: 0.0 if v is None else v),
    "repetition_penalty": ("rollout.repetition_penalty", same_value),
    "max_prompt_length": ("data.max_prompt_length", lambda v: 0 if v is None else v),
    "shuffle_dataset": ("data.shuffle", same_value),
    "beta": ("algorithm.beta", same_value),
    "epsilon": ("algorithm.epsilon", same_value),
    "epsilon_high": ("algorithm.epsilon_high", same_value),
    "delta": ("algorithm.policy_loss.delta", same_value),        # each applies under its entry (fold_translated)
    "sapo_temperature_pos": ("algorithm.policy_loss.tau_pos", same_value),
    "sapo_temperature_neg": ("algorithm.policy_loss.tau_neg", same_value),
    "vespo_k_pos": ("algorithm.policy_loss.k_pos", same_value),
    "vespo_lambda_pos": ("algorithm.policy_loss.lambda_pos", same_value),
    "vespo_k_neg": ("algorithm.policy_loss.k_neg", same_value),
    "vespo_lambda_neg": ("algorithm.policy_loss.lambda_neg", same_value),
    "scale_rewards": ("algorithm.advantage.scale_rewards", scale_rewards_value),   # grpo's (fold_translated)
    "importance_sampling_level": ("algorithm.importance_sampling_level", same_value),
    "num_iterations": ("algorithm.num_iterations", same_value),
    "mask_truncated_completions": ("algorithm.overlong_filter", same_value),
    "top_entropy_quantile": ("algorithm.top_entropy_rho", lambda v: v or TOP_ONE),    # 0.0: TRL's "the top token"
    "use_bias_correction_kl": ("algorithm.kl_ratio_correction", same_value),
    "off_policy_mask_threshold": ("algorithm.off_policy_mask.threshold", same_value),
    "vllm_importance_sampling_mode": ("algorithm.rollout_correction", same_value),
    "vllm_importance_sampling_cap": ("algorithm.rollout_correction.max", same_value),     # TRL's deprecated name
    "vllm_importance_sampling_clip_min": ("algorithm.rollout_correction.min", same_value),
    "vllm_importance_sampling_clip_max": ("algorithm.rollout_correction.max", same_value),
    "reward_weights": ("reward.weights", same_value),
    "seed": ("train.seed", same_value),
    "output_dir": ("train.output_dir", same_value),
    "save_total_limit": ("train.save_total_limit", lambda v: 0 if v is None else v),
    "gradient_checkpointing": ("train.gradient_checkpointing", same_value),
    "disable_dropout": ("train.disable_dropout", same_value),
    "overwrite_output_dir": ("train.overwrite_output_dir", same_value),
    "entropy_coef": ("algorithm.entropy_coef", same_value),
    "use_adaptive_entropy": ("algorithm.entropy_control", lambda v: "adaptive" if v else "fixed"),
    "entropy_target": ("algorithm.entropy_control.target", same_value),
    "entropy_coef_delta": ("algorithm.entropy_control.delta", same_value),
    "entropy_coef_min": ("algorithm.entropy_control.coef_min", same_value),
    "entropy_coef_max": ("algorithm.entropy_control.coef_max", same_value),
    "report_to": ("log.report_to", report_to_value),
    "run_name": ("log.run_name", same_value),
    "disable_tqdm": ("log.progress_bar", lambda v: not v),
    "use_cpu": ("model.device", lambda v: "cpu" if v else "auto"),
    # TRL's ModelConfig and ScriptArguments: the model and dataset keys of a `trl grpo --config` file
    "model_name_or_path": ("model.path", same_value),
    "dtype": ("model.dtype", dtype_value),
    "torch_dtype": ("model.dtype", dtype_value),
    "trust_remote_code": ("model.trust_remote_code", same_value),
    "attn_implementation": ("model.attn_implementation", same_value),
    "use_peft": ("lora.enabled", same_value),
    "lora_r": ("lora.r", same_value),
    "lora_alpha": ("lora.alpha", same_value),
    "lora_dropout": ("lora.dropout", same_value),
    "lora_target_modules": ("lora.target_modules", same_value),     # None: peft's default for the model type
    "dataset_name": ("data.dataset", same_value),
    "dataset_train_split": ("data.split", same_value),
    "chat_template_kwargs": ("data.chat_template_kwargs", lambda v: v or {}),
    "max_tool_calling_iterations": ("rollout.max_turns", same_value),
    **VLLM_KEYS,                                # vllm_mode, vllm_gpu_memory_utilization, ... -> rollout.vllm.*
}

#: TRL's batch keys: completions per device per forward/backward, and the accumulation steps of one
#: optimizer step. One TRL step trains on per_device_train_batch_size x gradient_accumulation_steps
#: completions (x processes), i.e. that / num_generations prompts: our train.prompts_per_step.
BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
              "generation_batch_size")
#: TRL counts optimizer updates; we count generation batches of num_iterations x mini_batches updates each.
STEP_KEYS = ("max_steps", "save_steps", "eval_steps", "save_strategy", "eval_strategy")
#: Warm-up: warmup_steps (a fraction of max_steps when < 1, as in transformers) or the older warmup_ratio.
WARMUP_KEYS = ("warmup_steps", "warmup_ratio")
#: TRL's reference refresh: sync_ref_model turns it on, every ref_model_sync_steps with mixup alpha.
REF_SYNC_KEYS = ("sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha")
#: TRL defaults used when only some of the combined keys are given (lora_*: ModelConfig's, under use_peft).
TRL_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_generations": 8,
                "ref_model_sync_steps": 512, "ref_model_mixup_alpha": 0.6, "lora_r": 16, "lora_alpha": 32,
                "lora_dropout": 0.05, "lora_target_modules": None}
#: top_entropy_quantile 0.0 (TRL: keep only the highest-entropy token): a rho that keeps ceil(rho x tokens) = 1.
TOP_ONE = 1e-9
#: TRL loss_type -> (algorithm.policy_loss, algorithm.loss_agg_mode). grpo: per-sequence token mean, then mean
#: over sequences; bnpo / dapo: mean over all tokens of the step; dr_grpo: token sum / max_completion_length;
#: luspo: GSPO's loss scaled by length (token sum per sequence, mean over sequences).
LOSS_TYPES = {"grpo": ("clip", "seq-mean-token-mean"), "bnpo": ("clip", "token-mean"), "dapo": ("clip", "token-mean"),
              "dr_grpo": ("clip", "seq-mean-token-sum-norm"), "cispo": ("cispo", "token-mean"),
              "sapo": ("sapo", "seq-mean-token-mean"), "luspo": ("clip", "seq-mean-token-sum"),
              "vespo": ("vespo", "token-mean")}
#: TRL's `trl grpo` reward arguments: a reward model, then reward functions (names or import paths).
REWARD_KEYS = ("reward_model_name_or_path", "reward_funcs")
#: Precision flags.
PRECISION_KEYS = {"bf16": "bf16", "fp16": "fp16"}

#: TRL keys that change nothing a run computes here, and why: accepted with a printed note.
NO_EFFECT = {
    **dict.fromkeys(("logging_steps", "logging_first_step", "logging_strategy"), "every step is logged"),
    "log_level": "grpo prints its own lines",
    **dict.fromkeys(("log_completions", "num_completions_to_print"),
                    "sample completions: log.samples_per_step and report.html"),
    "do_eval": "evaluation follows eval_strategy / eval_steps (train.eval_steps)",
    "per_device_eval_batch_size": "evaluation batches are sized by the run",
    **ENGINE_NOTES,                             # vllm_group_port, cache_implementation, transformers' batching
    "ds3_gather_for_generation": "no DeepSpeed here (torchrun DDP / FSDP2)",
    "pad_to_multiple_of": "padding changes no value here",
    **dict.fromkeys(("log_multimodal", "log_unique_prompts", "log_completions_hub_repo"),
                    "sample completions: log.samples_per_step and report.html"),
}

ALL_KEYS = (set(TRL_KEYS) | set(BATCH_KEYS) | set(STEP_KEYS) | set(REF_SYNC_KEYS) | set(REWARD_KEYS) | set(PRECISION_KEYS)
            | set(NO_EFFECT) | set(IF_DEFAULT) | set(WARMUP_KEYS) | {"loss_type", "multi_objective_aggregation", "model_init_kwargs",
                                "vllm_importance_sampling_correction", "generation_kwargs", "use_vllm"})


def is_trl_key(key: str) -> bool:
    return key in ALL_KEYS


def is_trl_name(key: str) -> bool:
    """A TRL key grpo maps, or another field of transformers' TrainingArguments (GRPOConfig's base class:
    lr_scheduler_kwargs, fsdp_config, eval_on_start, ...). A top-level key named so is read as TRL's even when its
    value is a mapping, so :func:`check_known` names it with the other unmapped TRL keys (not as a section)."""
    return key in ALL_KEYS or key in _training_arguments()


@functools.lru_cache(maxsize=1)
def _training_arguments() -> frozenset[str]:
    import dataclasses

    from transformers import TrainingArguments

    return frozenset(f.name for f in dataclasses.fields(TrainingArguments))


def _batch(trl: dict[str, Any], world_size: int) -> dict[str, Any]:
    """per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation -> micro_batch_size,
    prompts_per_step (a generation batch: per_device x steps_per_generation x processes completions) and
    mini_batches (its optimizer updates: steps_per_generation / gradient_accumulation_steps)."""
    if not any(k in trl for k in BATCH_KEYS):
        return {}
    per_device = trl.get("per_device_train_batch_size", TRL_DEFAULTS["per_device_train_batch_size"])
    accumulation = trl.get("gradient_accumulation_steps", TRL_DEFAULTS["gradient_accumulation_steps"])
    per_generation = _steps_per_generation(trl, world_size)
    group = trl.get("num_generations", TRL_DEFAULTS["num_generations"])
    completions = per_device * per_generation * world_size
    if completions % group:
        raise ConfigError(f"TRL keys per_device_train_batch_size={per_device} x steps_per_generation (or "
                          f"gradient_accumulation_steps)={per_generation} x {world_size} processes = {completions} "
                          f"completions per generation batch, not divisible by num_generations={group}")
    if per_generation % accumulation:
        raise ConfigError(f"TRL key steps_per_generation={per_generation} is not a multiple of "
                          f"gradient_accumulation_steps={accumulation}")
    return {"train.micro_batch_size": per_device, "train.prompts_per_step": completions // group,
            **({"algorithm.mini_batches": per_generation // accumulation} if per_generation > accumulation else {})}


def _steps_per_generation(trl: dict[str, Any], world_size: int) -> int:
    """TRL's steps_per_generation, or generation_batch_size / (per_device_train_batch_size x processes), or
    gradient_accumulation_steps (its default)."""
    per_device = trl.get("per_device_train_batch_size", TRL_DEFAULTS["per_device_train_batch_size"])
    if trl.get("steps_per_generation") and trl.get("generation_batch_size"):
        raise ConfigError("TRL keys steps_per_generation and generation_batch_size: give one (as TRL requires)")
    if trl.get("generation_batch_size"):
        size = int(trl["generation_batch_size"])
        if size % (per_device * world_size):
            raise ConfigError(f"TRL key generation_batch_size={size} is not a multiple of per_device_train_batch_size="
                              f"{per_device} x {world_size} processes")
        return size // (per_device * world_size)
    return trl.get("steps_per_generation") or trl.get("gradient_accumulation_steps",
                                                       TRL_DEFAULTS["gradient_accumulation_steps"])


def _steps(trl: dict[str, Any], world_size: int) -> dict[str, Any]:
    """max_steps / save_steps / eval_steps count TRL's optimizer updates; ours count generation batches, each of
    num_iterations x (steps_per_generation / gradient_accumulation_steps) updates, as TRL generates anew.
    save_strategy / eval_strategy no -> 0; eval_steps counts only under eval_strategy steps (TRL's default: no)."""
    if not any(k in trl for k in STEP_KEYS):
        return {}
    accumulation = trl.get("gradient_accumulation_steps", TRL_DEFAULTS["gradient_accumulation_steps"])
    per_generation = (trl.get("num_iterations") or 1) * (_steps_per_generation(trl, world_size) // accumulation)
    out = {}
    for key, strategy in (("save_steps", "save_strategy"), ("eval_steps", "eval_strategy")):
        if trl.get(strategy) not in (None, "steps", "no"):
            raise ConfigError(f"TRL key {strategy}: '{trl[strategy]}' has no equivalent here (steps or no)")
        if trl.get(strategy) == "no" or (key == "eval_steps" and "eval_steps" in trl and trl.get(strategy) != "steps"):
            out[f"train.{key}"] = 0                     # TRL evaluates only under eval_strategy: steps
        elif key == "eval_steps" and trl.get(strategy) == "steps" and not trl.get("eval_steps"):
            raise ConfigError("TRL key eval_strategy: steps needs eval_steps here (TRL would use logging_steps)")
    for key in ("max_steps", "save_steps", "eval_steps"):
        if key in trl and f"train.{key}" not in out and trl[key] is not None:
            value = _whole_steps(trl, key)
            if value % per_generation:
                raise ConfigError(f"TRL key {key}={value} counts optimizer updates, {per_generation} per generation "
                                  f"batch here (num_iterations x steps_per_generation / gradient_accumulation_steps): "
                                  f"give a multiple of {per_generation}")
            out[f"train.{key}"] = value // per_generation
    return out


def _whole_steps(trl: dict[str, Any], key: str) -> int:
    """TRL's save_steps / eval_steps (a fraction of max_steps when < 1, as transformers reads them) as updates."""
    value = trl[key]
    if value < 0:
        raise ConfigError(f"TRL key '{key}' must be >= 0, got {value}")
    if 0 < value < 1:
        if not trl.get("max_steps"):
            raise ConfigError(f"TRL key '{key}'={value} is a fraction of max_steps: give max_steps, or whole steps")
        return math.ceil(trl["max_steps"] * value)
    if value != int(value):
        raise ConfigError(f"TRL key '{key}' expects whole steps (or a fraction below 1), got {value}")
    return int(value)


def _warmup(trl: dict[str, Any]) -> dict[str, Any]:
    """warmup_steps (>= 1: optimizer updates, as optim.warmup_steps counts them; below 1: a fraction of max_steps,
    as transformers reads it) or the older warmup_ratio (a fraction); warmup_steps > 0 wins, as in TRL."""
    steps, ratio = trl.get("warmup_steps"), trl.get("warmup_ratio")
    if steps is not None and (steps >= 1 or (steps == 0 and not ratio)):
        if steps != int(steps):
            raise ConfigError(f"TRL key 'warmup_steps' expects whole steps (or a fraction below 1), got {steps}")
        return {"optim.warmup_steps": int(steps)}
    key, fraction = ("warmup_steps", steps) if steps else ("warmup_ratio", ratio)
    if fraction is None:
        return {}
    if not 0 <= fraction <= 1:
        raise ConfigError(f"TRL key '{key}' must be >= 0 (below 1: a fraction of max_steps), got {fraction}")
    if fraction and not trl.get("max_steps"):
        raise ConfigError(f"TRL key '{key}'={fraction} is a fraction of max_steps: give max_steps, or warmup_steps "
                          f"as a number of steps")
    return {"optim.warmup_steps": math.ceil(trl.get("max_steps", 0) * fraction)}


def _ref_sync(trl: dict[str, Any]) -> dict[str, Any]:
    """sync_ref_model (+ ref_model_sync_steps, ref_model_mixup_alpha) -> algorithm.ref_update_steps / ref_mix_alpha."""
    if not trl.get("sync_ref_model"):
        return {}
    return {"algorithm.ref_update_steps": trl.get("ref_model_sync_steps", TRL_DEFAULTS["ref_model_sync_steps"]),
            "algorithm.ref_mix_alpha": trl.get("ref_model_mixup_alpha", TRL_DEFAULTS["ref_model_mixup_alpha"])}


def _loss(trl: dict[str, Any]) -> dict[str, Any]:
    """loss_type -> the policy loss and aggregation; under cispo TRL reads epsilon_high (else epsilon, 0.2) as
    the cap of the importance weight: algorithm.policy_loss.max."""
    if "loss_type" not in trl:
        return {}
    if trl["loss_type"] not in LOSS_TYPES:
        raise ConfigError(f"TRL key 'loss_type': '{trl['loss_type']}' has no equivalent here (known: "
                          f"{', '.join(LOSS_TYPES)})")
    policy, aggregation = LOSS_TYPES[trl["loss_type"]]
    out = {"algorithm.policy_loss": policy, "algorithm.loss_agg_mode": aggregation}
    if policy == "cispo":
        out["algorithm.policy_loss.max"] = trl.get("epsilon_high") or trl.get("epsilon", 0.2)
    return out


def _objectives(trl: dict[str, Any]) -> dict[str, Any]:
    """multi_objective_aggregation -> algorithm.reward_combination; TRL's normalize_then_sum then standardises the
    summed rewards over the whole batch whatever scale_rewards says: our scale_rewards batch (the group mean
    it subtracts is already 0 after the per-function group normalisation)."""
    mode = trl.get("multi_objective_aggregation")
    if mode is None:
        return {}
    return {"algorithm.reward_combination": mode, **({"algorithm.advantage.scale_rewards": "batch"}
                                                      if mode == "normalize_then_sum" else {})}


def _rewards(trl: dict[str, Any]) -> dict[str, Any]:
    """reward_model_name_or_path (a directory) and reward_funcs -> reward.functions, the model first as in TRL.
    A name goes through grpo.rewards.load_reward: our built-ins, `package.module.function`, file.py:function."""
    if not any(trl.get(k) for k in REWARD_KEYS):
        return {}
    funcs = trl.get("reward_funcs") or []
    model = [trl["reward_model_name_or_path"]] if trl.get("reward_model_name_or_path") else []
    return {"reward.functions": model + ([funcs] if isinstance(funcs, str) else list(funcs))}


def _precision(trl: dict[str, Any]) -> dict[str, Any]:
    on = [PRECISION_KEYS[k] for k in PRECISION_KEYS if trl.get(k)]
    if len(on) > 1:
        raise ConfigError("TRL keys bf16 and fp16 are both true: choose one")
    given = any(trl.get(k) is not None for k in PRECISION_KEYS)        # bf16: null is TRL's "auto"
    return {"train.precision": on[0]} if on else ({"train.precision": "fp32"} if given else {})


def check_known(trl: dict[str, Any]) -> None:
    """One ConfigError naming every key of `trl` that is no TRL key mapped here (with the closest one)."""
    unknown = [k for k in trl if k not in ALL_KEYS]
    if unknown:
        named = ", ".join(f"'{k}'{did_you_mean(k, sorted(ALL_KEYS) + list(SECTIONS))}" for k in unknown)
        raise ConfigError(f"{'key' if len(unknown) == 1 else 'keys'} {named}: no TRL key grpo maps, nor one of its "
                          f"sections (docs/migrating-from-trl.md lists the mapped TRL keys; our own keys are "
                          f"given as section.key)")


def from_trl(trl: dict[str, Any], world_size: int = 1) -> tuple[dict[str, Any], list[str]]:
    """Our `section.key` overrides for a flat dict of TRL GRPOConfig keys, and one `trl_key -> our.key`
    line per key (what was mapped, or ignored: :data:`NO_EFFECT`). Keys with no equivalent raise one
    ConfigError naming them all, each with the closest TRL key or section when one is near."""
    check_known(trl)
    trl = check_values(trl)
    overrides: dict[str, Any] = {}
    lines: list[str] = []
    if "max_steps" in trl and (trl["max_steps"] is None or trl["max_steps"] <= 0):     # TRL: train for epochs
        steps, epochs = trl.pop("max_steps"), trl.pop("num_train_epochs", 3)
        overrides["train.num_train_epochs"] = float(epochs)
        lines.append(f"max_steps {steps}, num_train_epochs {epochs} -> train.num_train_epochs (train.max_steps from "
                     f"the training set's size)")
    elif "num_train_epochs" in trl and "max_steps" not in trl:
        overrides["train.num_train_epochs"] = float(trl.pop("num_train_epochs"))
        lines.append("num_train_epochs -> train.num_train_epochs (train.max_steps from the training set's size)")
    for key, value in trl.items():
        if key in IF_DEFAULT:
            accepted, note, error = IF_DEFAULT[key]
            if not accepted(value, trl):
                raise ConfigError(f"TRL key '{key}': " + error.format(v=value))
            lines.append(f"{key} ignored ({note})")
        elif key in TRL_KEYS:
            ours, convert = TRL_KEYS[key]
            overrides[ours] = convert(value)
            lines.append(f"{key} -> {ours}")
        elif key in NO_EFFECT:
            lines.append(f"{key} ignored ({NO_EFFECT[key]})")
    for keys, combined in ((BATCH_KEYS, _batch(trl, world_size)), (STEP_KEYS, _steps(trl, world_size)), (REF_SYNC_KEYS, _ref_sync(trl)),
                           (REWARD_KEYS, _rewards(trl)), (tuple(PRECISION_KEYS), _precision(trl)), (WARMUP_KEYS, _warmup(trl)),
                           (("loss_type", "epsilon_high") if trl.get("loss_type") == "cispo" else ("loss_type",),
                            _loss(trl)), (("multi_objective_aggregation",), _objectives(trl)),
                           (("model_init_kwargs", "vllm_importance_sampling_correction"), model_init_overrides(trl)),
                           (("generation_kwargs",), generation_overrides(trl)),
                           (("use_vllm",), engine_overrides(trl))):
        overrides.update(combined)
        if combined:
            lines.append(f"{', '.join(k for k in keys if k in trl)} -> {', '.join(combined)}")
    return fold_translated(_as_trl_does(trl, overrides, lines)), lines


def _as_trl_does(trl: dict[str, Any], overrides: dict[str, Any], lines: list[str]) -> dict[str, Any]:
    """What TRL does with the keys left out: use_peft's LoRA takes ModelConfig's defaults (dropout 0.05, target
    modules None: peft's default for the model type, resolved by grpo.api.inputs.resolve_config); transformers'
    `constant` schedule ignores warm-up (`constant_with_warmup` keeps it); top_entropy_quantile 0.0 keeps one token."""
    if trl.get("use_peft"):
        added = {f"lora.{k[5:] if k != 'lora_r' else 'r'}": v for k, v in TRL_DEFAULTS.items()
                 if k.startswith("lora_") and k not in trl}
        overrides.update(added)
        if added:
            lines.append(f"use_peft -> {', '.join(added)} (TRL's ModelConfig defaults)")
    if trl.get("lr_scheduler_type") == "constant" and overrides.get("optim.warmup_steps"):
        overrides["optim.warmup_steps"] = 0
        lines.append("warmup ignored under lr_scheduler_type constant, as transformers does (constant_with_warmup "
                     "warms up)")
    if trl.get("top_entropy_quantile") == 0:
        lines.append("top_entropy_quantile 0.0 -> only the highest-entropy token of the step's batch trains")
    return overrides
