"""A TRL `GRPOConfig` object (any dataclass of TRL keys) as the flat dict of TRL keys grpo.config.trl maps.

A user who hands over a `GRPOConfig` runs TRL code, so TRL's defaults are meant: :func:`trl_fields` gives every
field grpo maps to a training setting (:data:`DEFAULTS_APPLIED`: loss_type dapo, beta 0.0, lr_scheduler_type
linear, seed 42, max_completion_length 512, ...) at the object's value, set or not. Every other field is given
only when it differs from a default-constructed object of the same class, so what `__post_init__` derives
(transformers' `activation_checkpointing`, `accelerator_config`, `debug`, `dataloader_pin_memory`, a field
that shadows its parent's default) is not taken for a user's setting. Enum values (`SchedulerType.COSINE`,
`SaveStrategy.NO`) become their `.value`, and of the pair `steps_per_generation` / `generation_batch_size`,
which TRL always fills both of, only `steps_per_generation` is kept (one setting).

Not applied at their TRL default, mapped only when set (:data:`ONLY_IF_SET`, with why), are the fields whose
default would change a run here in a way TRL's does not, or has no meaning here.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Any

from grpo.config.trl import ALL_KEYS, TRL_KEYS

#: Fields whose TRL default is not applied from an object (mapped only when set), and why.
ONLY_IF_SET = {
    **dict.fromkeys(("vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                     "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_min",
                     "vllm_importance_sampling_clip_max"),
                    "TRL corrects vLLM's samples only (use_vllm); under rollout.engine vllm grpo turns the correction "
                    "on itself at these defaults (sequence_mask, C_max 3.0), and the native and transformers engines, "
                    "which sample from the policy being trained, are left uncorrected unless it is set"),
    **dict.fromkeys(("vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_enable_sleep_mode",
                     "vllm_max_model_length", "vllm_model_impl", "vllm_server_base_url", "vllm_server_host",
                     "vllm_server_port", "vllm_server_timeout"),
                    "rollout.vllm's defaults are TRL's or change no result: model_impl auto (vLLM's choice), "
                    "server_host 127.0.0.1 (the local server TRL's 0.0.0.0 reaches), max_model_length 0 (sized from "
                    "the prompts; TRL: the model's)"),
    "max_tool_calling_iterations": "TRL's None (no limit) has no equivalent: rollout.max_turns keeps its 4",
    **dict.fromkeys(("save_steps", "save_strategy", "eval_steps", "eval_strategy", "save_total_limit"),
                    "checkpoint / evaluation cadence trains nothing; TRL's save_steps 500 counts optimizer "
                    "updates and need not divide grpo's steps"),
    **dict.fromkeys(("report_to", "run_name", "disable_tqdm"), "logging only (transformers' defaults vary by "
                                                               "version: report_to 'all' has no equivalent)"),
}
#: Fields mapped at the object's value whether set or not (TRL's defaults apply); the rest: only when changed.
DEFAULTS_APPLIED_EXTRA = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                          "generation_batch_size", "max_steps", "warmup_steps", "warmup_ratio", "loss_type",
                          "bf16", "fp16", "multi_objective_aggregation", "sync_ref_model", "ref_model_sync_steps",
                          "ref_model_mixup_alpha", "generation_kwargs", "model_init_kwargs")
#: The fields a default object is built with, so that what they decide (bf16 on a CPU-only machine is an error
#: in transformers; use_cpu derives dataloader_pin_memory) matches the user's object.
REFERENCE_SEED = ("output_dir", "bf16", "fp16", "use_cpu")


def plain(value: Any) -> Any:
    """An enum as its value (`SchedulerType.COSINE` -> 'cosine'), in lists too; anything else as it is."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def defaults_applied() -> frozenset[str]:
    return frozenset(set(TRL_KEYS) | set(DEFAULTS_APPLIED_EXTRA)) - set(ONLY_IF_SET)


def _reference(obj: Any) -> Any:
    """A default-constructed object of obj's class (seeded with :data:`REFERENCE_SEED`), or None if it cannot be."""
    names = {f.name for f in dataclasses.fields(obj) if f.init}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return type(obj)(**{k: getattr(obj, k) for k in REFERENCE_SEED if k in names})
    except Exception:                    # e.g. a required field without a default: compare with declared defaults
        return None


def _declared_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def trl_fields(obj: Any, changed: set[str] | None = None) -> dict[str, Any]:
    """The TRL keys of a GRPOConfig-like dataclass object: every field of :func:`defaults_applied`, and the other
    fields that differ from a default-constructed object's (enums as values; of steps_per_generation and
    generation_batch_size, both filled by TRL, steps_per_generation alone; activation_checkpointing, transformers'
    new name, as gradient_checkpointing). `changed`, when given, receives the names of the fields the user set."""
    applied, reference = defaults_applied(), _reference(obj)
    out = {}
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        value = plain(getattr(obj, f.name))
        default = plain(getattr(reference, f.name) if reference is not None else _declared_default(f))
        if default is dataclasses.MISSING or value != default:
            out[f.name] = value
            changed.add(f.name) if changed is not None else None
        elif f.name in applied:
            out[f.name] = value
    if changed is not None and "activation_checkpointing" in changed:
        changed.add("gradient_checkpointing")
    if "activation_checkpointing" in out:            # transformers' new name of gradient_checkpointing (one setting)
        out["gradient_checkpointing"] = out.pop("activation_checkpointing")
    if out.get("steps_per_generation") is not None and out.get("generation_batch_size") is not None:
        del out["generation_batch_size"]             # derived from steps_per_generation (or it from this): one setting
    return out


def object_lines(lines: list[str], changed: set[str]) -> list[str]:
    """The mapping lines (`key -> ours`, `a, b -> x, y`, `key ignored (...)`, notes) of the fields the user set (and
    output_dir, bf16 / fp16, use_cpu, max_steps), the notes naming no key, then one line for the TRL defaults applied to the other mapped keys."""
    def keys(line: str) -> set[str]:
        head = line.split(" -> ")[0].split(" ignored")[0]
        return {k.split(" ")[0] for k in head.split(", ")} & ALL_KEYS

    shown = changed | set(REFERENCE_SEED) | {"max_steps"}        # max_steps -1: TRL's epochs: say so
    kept = [line for line in lines if not keys(line) or keys(line) & shown]
    if len(kept) == len(lines):
        return kept
    return kept + [f"TRL's GRPOConfig defaults for the {len(lines) - len(kept)} other mapped keys (loss_type dapo, "
                   f"beta 0.0, seed 42, ...: docs/migrating-from-trl.md)"]
