"""What every runtime shares for its memory plan: the planner's view of the policy and of a step, the budget the
user set, and the reference-offload choice (grpo.training.runtime, grpo.training.cpu_runtime).
"""

from __future__ import annotations

import torch

from grpo.config import Config

#: `train.ref_offload: auto` offloads a reference copy of at least this many bytes (a smaller one saves less
#: than the runtime's own run-to-run spread in peak RSS).
REF_OFFLOAD_MIN_BYTES = 64 * 2 ** 20


def resolve_ref_offload(cfg: Config, model: torch.nn.Module, auto_choice: str) -> str:
    """`train.ref_offload` as given, or for auto: `auto_choice` when the run builds a full frozen reference copy
    (beta > 0, no LoRA, algorithm.ref_update_steps = 0) of at least REF_OFFLOAD_MIN_BYTES, else none."""
    from grpo.modeling.lora import is_lora
    from grpo.modeling.offload import tensor_bytes, unique_parameters

    mode = cfg.train.ref_offload
    if mode != "auto":
        return mode
    full_copy = cfg.algorithm.beta > 0 and not cfg.algorithm.ref_update_steps and not is_lora(model)
    return auto_choice if full_copy and tensor_bytes(unique_parameters(model)) >= REF_OFFLOAD_MIN_BYTES else "none"

#: The share of the memory still available that the default budget (`train.memory_budget_gib = 0`) may use:
#: the rest is left to the other processes, the page cache and the estimate's error.
SAFE_SHARE = 0.8


def configured_budget(cfg: Config) -> int:
    """`train.memory_budget_gib` in bytes (0 = auto)."""
    return int(cfg.train.memory_budget_gib * 2 ** 30)


def model_shape(model: torch.nn.Module, act_bytes: int, compute_dtype: torch.dtype | None = None,
                offloaded_ref: bool = False, rollout_dtype: torch.dtype | None = None):
    """The planner's view of a policy (grpo.training.memory_plan.ModelShape) from its config and parameters;
    `compute_dtype`: autocast's dtype (`train.precision`), None for the parameters' own; `offloaded_ref`: the
    reference's weights (counted at the policy's size) are loaded for the reference phase (`train.ref_offload`);
    `rollout_dtype`: autocast's dtype in the rollout when `rollout.precision` differs from `train.precision`."""
    from grpo.modeling.hooks import installed
    from grpo.modeling.lean_layers import lean_mlps
    from grpo.modeling.offload import tensor_bytes, unique_parameters
    from grpo.training.memory_plan import ModelShape, runtime_allowance

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    c = getattr(inner, "config", None)
    c = c.get_text_config() if hasattr(c, "get_text_config") else c
    hidden = int(getattr(c, "hidden_size", 0) or 0)
    heads = int(getattr(c, "num_attention_heads", 1) or 1)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    return ModelShape(hidden=hidden, intermediate=int(getattr(c, "intermediate_size", 0) or 4 * hidden),
                      layers=int(getattr(c, "num_hidden_layers", 0) or 0),
                      kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                      head_dim=int(getattr(c, "head_dim", None) or hidden // heads),
                      vocab=int(getattr(c, "vocab_size", 0) or 0),
                      trainable_params=n_trainable, slack_bytes=runtime_allowance(n_trainable),
                      param_bytes=trainable[0].element_size() if trainable else 4, act_bytes=act_bytes,
                      lean_layers=act_bytes == 4 and lean_mlps(model) > 0,
                      packed_rollout=bool(trainable) and installed().rollout.pack_rows(   # the runtime's rollout hook
                          trainable[0].device, rollout_dtype or compute_dtype or trainable[0].dtype, 1) is not None,
                      rollout_bytes=rollout_dtype.itemsize if rollout_dtype is not None else 0,
                      offloaded_ref_bytes=tensor_bytes(unique_parameters(model)) if offloaded_ref else 0)


def step_shape(cfg: Config, prompt_tokens: int, engine: str = "native"):
    """The planner's view of one step (grpo.training.memory_plan.StepShape): B prompts of up to `prompt_tokens`
    tokens, k completions each (algorithm.gfpo_filter.sample_size or G), max_new_tokens long; under `engine` vllm the rollout's cache
    is vLLM's (reserved at its start, in use when the plan is made; or in a server): not counted again."""
    from grpo.training.memory_plan import StepShape

    k = cfg.algorithm.gfpo_filter.params.sample_size or cfg.rollout.num_generations
    return StepShape(rows=cfg.train.prompts_per_step * k, prompts=cfg.train.prompts_per_step,
                     prompt_tokens=prompt_tokens, new_tokens=cfg.rollout.max_new_tokens, own_rollout=engine != "vllm")


def plan_for(runtime, model: torch.nn.Module, prompt_tokens: int, optimizer=None, engine: str = "native"):
    """The memory plan of `runtime`'s run (grpo.training.memory_plan.plan_memory) for prompts of up to
    `prompt_tokens` tokens: the configured settings, what is in use now and the budget. The planner counts AdamW's
    moments itself, so `optimizer`'s state already in memory (made up front, or a resumed run's) is taken out of
    what is in use."""
    from grpo.modeling.precision import autocast_dtype, rollout_precision
    from grpo.training.memory_plan import plan_memory
    from grpo.training.update import state_bytes

    cfg = runtime.cfg
    lowp = autocast_dtype(cfg.train.precision)
    rollout = rollout_precision(cfg.rollout.precision, cfg.train.precision)
    rollout_dtype = (autocast_dtype(rollout) or torch.float32) if rollout != cfg.train.precision else None
    shape = model_shape(model, 2 if lowp is not None else 4, lowp, runtime.ref_offload(model) != "none", rollout_dtype)
    in_use = runtime.memory_in_use() - state_bytes(optimizer, runtime.device)
    return plan_memory(shape, step_shape(cfg, prompt_tokens, engine), in_use=in_use,
                       budget=runtime.memory_budget(), auto_tokens=runtime.micro_batch_tokens(model),
                       micro_batch_tokens=cfg.train.micro_batch_tokens,
                       gradient_checkpointing=cfg.train.gradient_checkpointing,
                       logprob_chunk_size=cfg.train.logprob_chunk_size,
                       logprob_micro_batch_tokens=cfg.train.logprob_micro_batch_tokens)
