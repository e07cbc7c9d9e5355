"""TRL `GRPOConfig` keys -> our config keys, for configs written for Hugging Face TRL.

:func:`from_trl` turns a flat dict of TRL keys into our `section.key` overrides. Every key in
:data:`TRL_KEYS` maps to one of ours, with the value converted where the vocabularies differ
(`loss_type`, `scale_rewards`, `lr_scheduler_type`, `report_to`, `bf16`/`fp16`). A few TRL keys
combine into one of ours (:data:`BATCH_KEYS`, :data:`REF_SYNC_KEYS`). A TRL key with no equivalent
is an error that names it. Only the keys given are mapped: TRL's defaults are not ours (TRL's beta
is 0.0, ours 0.04; write `beta` explicitly to match a TRL run).
"""

from __future__ import annotations

from typing import Any, Callable

from grpo.config import ConfigError


def _same(value: Any) -> Any:
    return value


def _loss_type(value: Any) -> str:
    """TRL loss_type -> algorithm.loss_agg_mode: grpo = per-sequence token mean, then mean over sequences;
    bnpo / dapo = mean over all tokens of the batch; dr_grpo = token sum / (max_completion_length), then mean."""
    table = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
             "dr_grpo": "seq-mean-token-sum-norm"}
    if value not in table:
        raise ConfigError(f"TRL key 'loss_type': '{value}' has no equivalent here (known: {', '.join(table)})")
    return table[value]


def _scale_rewards(value: Any) -> str:
    """TRL scale_rewards: True = group, False = none, or the string itself (group | batch | none)."""
    if isinstance(value, bool):
        return "group" if value else "none"
    return str(value)


def _lr_scheduler(value: Any) -> str:
    table = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"}
    if value not in table:
        raise ConfigError(f"TRL key 'lr_scheduler_type': '{value}' has no equivalent here (known: {', '.join(table)})")
    return table[value]


def _report_to(value: Any) -> list[str]:
    if value in (None, "none", []):
        return []
    return [value] if isinstance(value, str) else list(value)


#: TRL key -> (our key, value conversion).
TRL_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "learning_rate": ("optim.lr", _same),
    "weight_decay": ("optim.weight_decay", _same),
    "adam_beta1": ("optim.adam_beta1", _same),
    "adam_beta2": ("optim.adam_beta2", _same),
    "max_grad_norm": ("optim.max_grad_norm", _same),
    "warmup_steps": ("optim.warmup_steps", _same),
    "lr_scheduler_type": ("optim.lr_scheduler", _lr_scheduler),
    "num_generations": ("rollout.num_generations", _same),
    "max_completion_length": ("rollout.max_new_tokens", _same),
    "temperature": ("rollout.temperature", _same),
    "top_p": ("rollout.top_p", _same),
    "top_k": ("rollout.top_k", lambda v: 0 if v is None else v),
    "max_prompt_length": ("data.max_prompt_length", lambda v: 0 if v is None else v),
    "shuffle_dataset": ("data.shuffle", _same),
    "beta": ("algorithm.beta", _same),
    "epsilon": ("algorithm.epsilon", _same),
    "epsilon_high": ("algorithm.epsilon_high", _same),
    "loss_type": ("algorithm.loss_agg_mode", _loss_type),
    "scale_rewards": ("algorithm.scale_rewards", _scale_rewards),
    "importance_sampling_level": ("algorithm.importance_sampling_level", _same),
    "num_iterations": ("algorithm.num_iterations", _same),
    "mask_truncated_completions": ("algorithm.overlong_filter", _same),
    "top_entropy_quantile": ("algorithm.top_entropy_rho", _same),
    "use_bias_correction_kl": ("algorithm.kl_ratio_correction", _same),
    "off_policy_mask_threshold": ("algorithm.off_policy_mask_threshold", _same),
    "vllm_importance_sampling_mode": ("algorithm.rollout_correction", _same),
    "vllm_importance_sampling_clip_min": ("algorithm.rollout_correction_min", _same),
    "vllm_importance_sampling_clip_max": ("algorithm.rollout_correction_max", _same),
    "reward_weights": ("reward.weights", _same),
    "max_steps": ("train.max_steps", _same),
    "seed": ("train.seed", _same),
    "output_dir": ("train.output_dir", _same),
    "save_steps": ("train.save_steps", lambda v: int(v)),
    "save_total_limit": ("train.save_total_limit", lambda v: 0 if v is None else v),
    "gradient_checkpointing": ("train.gradient_checkpointing", _same),
    "report_to": ("log.report_to", _report_to),
    "run_name": ("log.run_name", _same),
    "disable_tqdm": ("log.progress_bar", lambda v: not v),
}

#: TRL's batch keys: completions per device per forward/backward, and the accumulation steps of one
#: optimizer step. One TRL step trains on per_device_train_batch_size x gradient_accumulation_steps
#: completions (x processes), i.e. that / num_generations prompts: our train.prompts_per_step.
BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps")
#: TRL's reference refresh: sync_ref_model turns it on, every ref_model_sync_steps with mixup alpha.
REF_SYNC_KEYS = ("sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha")
#: TRL defaults used when only some of the combined keys are given.
TRL_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_generations": 8,
                "ref_model_sync_steps": 512, "ref_model_mixup_alpha": 0.6}
#: Precision flags.
PRECISION_KEYS = {"bf16": "bf16", "fp16": "fp16"}

ALL_KEYS = set(TRL_KEYS) | set(BATCH_KEYS) | set(REF_SYNC_KEYS) | set(PRECISION_KEYS)


def is_trl_key(key: str) -> bool:
    return key in ALL_KEYS


def _batch(trl: dict[str, Any], world_size: int) -> dict[str, Any]:
    """per_device_train_batch_size / gradient_accumulation_steps -> micro_batch_size and prompts_per_step."""
    if not any(k in trl for k in BATCH_KEYS):
        return {}
    per_device = trl.get("per_device_train_batch_size", TRL_DEFAULTS["per_device_train_batch_size"])
    accumulation = trl.get("gradient_accumulation_steps", TRL_DEFAULTS["gradient_accumulation_steps"])
    group = trl.get("num_generations", TRL_DEFAULTS["num_generations"])
    completions = per_device * accumulation * world_size
    if completions % group:
        raise ConfigError(f"TRL keys per_device_train_batch_size={per_device} x gradient_accumulation_steps="
                          f"{accumulation} x {world_size} processes = {completions} completions per step, not "
                          f"divisible by num_generations={group}")
    return {"train.micro_batch_size": per_device, "train.prompts_per_step": completions // group}


def _ref_sync(trl: dict[str, Any]) -> dict[str, Any]:
    """sync_ref_model (+ ref_model_sync_steps, ref_model_mixup_alpha) -> algorithm.ref_update_steps / ref_mix_alpha."""
    if not trl.get("sync_ref_model"):
        return {}
    return {"algorithm.ref_update_steps": trl.get("ref_model_sync_steps", TRL_DEFAULTS["ref_model_sync_steps"]),
            "algorithm.ref_mix_alpha": trl.get("ref_model_mixup_alpha", TRL_DEFAULTS["ref_model_mixup_alpha"])}


def _precision(trl: dict[str, Any]) -> dict[str, Any]:
    on = [PRECISION_KEYS[k] for k in PRECISION_KEYS if trl.get(k)]
    if len(on) > 1:
        raise ConfigError("TRL keys bf16 and fp16 are both true: choose one")
    return {"train.precision": on[0]} if on else ({"train.precision": "fp32"} if any(k in trl for k in PRECISION_KEYS)
                                                 else {})


def from_trl(trl: dict[str, Any], world_size: int = 1) -> tuple[dict[str, Any], list[str]]:
    """Our `section.key` overrides for a flat dict of TRL GRPOConfig keys, and one `trl_key -> our.key`
    line per key (what was mapped). A key with no equivalent raises ConfigError naming it."""
    unknown = [k for k in trl if k not in ALL_KEYS]
    if unknown:
        raise ConfigError(f"TRL key '{unknown[0]}' has no equivalent in grpo (docs/migrating-from-trl.md lists the "
                          f"mapped keys; our own keys are given as section.key)")
    overrides: dict[str, Any] = {}
    lines: list[str] = []
    for key, value in trl.items():
        if key in TRL_KEYS:
            ours, convert = TRL_KEYS[key]
            overrides[ours] = convert(value)
            lines.append(f"{key} -> {ours}")
    for keys, combined in ((BATCH_KEYS, _batch(trl, world_size)), (REF_SYNC_KEYS, _ref_sync(trl)),
                           (tuple(PRECISION_KEYS), _precision(trl))):
        overrides.update(combined)
        if combined:
            lines.append(f"{', '.join(k for k in keys if k in trl)} -> {', '.join(combined)}")
    return overrides, lines
