"""The policy update: micro-batches, backward, gradient clipping, optimizer step.

This is the only module that calls ``backward()``. Micro-batch losses are shares of the step loss
(see ``grpo.algorithms.loss.AGGREGATIONS``), so gradient accumulation equals one full-batch update.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from grpo.accelerator import host_values
from grpo.algorithms.schedule import lr_factor
from grpo.config import AlgorithmConfig, OptimConfig
from grpo.modeling.logprobs import bucketed_micro_batches, completion_logprobs
from grpo.modeling.hooks import installed as model_hooks
from grpo.algorithms.loss import AGGREGATIONS, LOSS_STATS, grpo_loss, logprob_gap_sums
from grpo.algorithms.policy_losses import PolicyLossParams
from grpo.algorithms.stabilisers import off_policy_sequence_mask, rollout_correction_weights
from grpo.modeling.precision import active_dtype, cast_frozen_linears, cast_trainable_linears, loss_scaler, paused
from grpo.types import TrainBatch, UpdateStats  # noqa: F401


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int, extra_groups: list | tuple = ()):
    """AdamW over trainable parameters, with linear warm-up then constant / linear / cosine decay.

    `extra_groups`: more parameter groups (learnable loss modules, grpo.training.loss_modules), each with
    its own lr; the schedule's factor applies to every group. The fused AdamW kernel is used when every
    parameter is a plain floating tensor on CPU or CUDA (5x faster than the per-tensor loop on CPU and
    without its temporaries; DTensor shards of FSDP2 take the default implementation)."""
    params = [p for p in model.parameters() if p.requires_grad]
    every = params + [p for g in extra_groups for p in g["params"]]
    fused = bool(params) and all(type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda")
                                 and p.is_floating_point() for p in every)
    optimizer = torch.optim.AdamW([{"params": params}, *extra_groups], lr=cfg.lr,
                                  betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay, fused=fused or None)

    allocate_adam_state(optimizer)
    factor = functools.partial(lr_factor, warmup_steps=cfg.warmup_steps, total_steps=total_steps,
                               kind=cfg.lr_scheduler)                    # grpo.algorithms.schedule
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def allocate_adam_state(optimizer: torch.optim.Optimizer) -> int:
    """Create an Adam / AdamW optimizer's state now, as its first ``step()`` would (every entry zero: moments
    and step count), instead of lazily inside the first update. Returns the parameters given a state.

    Lazily, the moments (2x the trainable weights) are made inside the first update, after its activations were
    freed, and take the heap room the next step's activations and gradients then find gone. Measured on a 75.7M
    model (bench/grid.py's vocab256 point, 2 threads, `grpo train`, ~12 runs each way): the second update's page
    faults fell from 46-62 k to 16-35 k and steps 2-3 were ~4 % faster on average, within this host's run-to-run
    noise; the peak RSS did not move beyond its own noise (1930-2240 MiB either way).

    The state's layout (which keys, their dtypes and devices: fused, capturable, amsgrad) is read from the same
    optimizer class stepped once on a one-element probe with the group's options, so it is the optimizer's own.
    Other optimizers, parameters that already have a state (grpo.state.resume clears these zeros before loading a
    checkpoint's), and tensor subclasses (FSDP2's DTensor shards) are left to the lazy path.
    """
    if not isinstance(optimizer, torch.optim.Adam):              # AdamW is an Adam; other classes' state is not all 0
        return 0
    made = 0
    for group in optimizer.param_groups:
        options = {k: v for k, v in group.items() if k != "params"}
        layouts: dict = {}                                       # (dtype, device) -> {key: (dtype, device, 0-d)}
        for p in group["params"]:
            if optimizer.state.get(p) or type(p.data) is not torch.Tensor:
                continue
            key = (p.dtype, p.device)
            if key not in layouts:
                layouts[key] = _probe_layout(type(optimizer), options, p)
            layout = layouts[key]
            if layout is None:
                continue
            optimizer.state[p] = {name: torch.zeros((), dtype=dtype, device=device) if scalar
                                  else torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
                                  for name, (dtype, device, scalar) in layout.items()}
            made += 1
    return made


def state_bytes(optimizer: torch.optim.Optimizer | None, device: torch.device) -> int:
    """Bytes of the optimizer's state tensors on `device` (the moments made up front or loaded from a checkpoint):
    what the memory planner takes out of the measured memory in use, since it counts the moments itself."""
    if optimizer is None:
        return 0
    return sum(v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
               if isinstance(v, torch.Tensor) and v.device.type == device.type)


def _probe_layout(cls: type, options: dict, like: torch.Tensor) -> dict | None:
    """The state entries `cls` makes for a parameter like `like` under the group `options`: name -> (dtype,
    device, whether 0-d), from one step of a one-element probe with a zero gradient; None when an entry is not a
    tensor of the probe's shape or 0-d (then the layout is not one this function can reproduce)."""
    probe = torch.zeros(1, dtype=like.dtype, device=like.device, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    optimizer = cls([{**options, "params": [probe]}])
    optimizer.step()
    layout = {}
    for name, value in optimizer.state[probe].items():
        if not isinstance(value, torch.Tensor) or value.shape not in (torch.Size([]), probe.shape):
            return None
        layout[name] = (value.dtype, value.device, value.dim() == 0)
    return layout


def set_gradient_checkpointing(model: torch.nn.Module, enabled: bool) -> None:
    """Turn the transformer layers' activation checkpointing on or off (non-reentrant; LoRA too).

    Only the layer inputs are stored in the forward pass; the backward pass recomputes each layer.
    A no-op when the model has no Hugging Face checkpointing support or is already in that state.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(inner, "supports_gradient_checkpointing", False):
        return
    if hasattr(type(inner), "is_activation_checkpointing"):      # transformers >= 5.x names
        active = inner.is_activation_checkpointing
        enable = lambda: inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})  # noqa: E731
        disable = inner.activation_checkpointing_disable
    else:
        active = inner.is_gradient_checkpointing
        enable = lambda: inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # noqa: E731
        disable = inner.gradient_checkpointing_disable
    if enabled and not active:
        enable()
    elif not enabled and active:
        disable()


def policy_weight(algo: AlgorithmConfig, logp: torch.Tensor, old: torch.Tensor, mb: TrainBatch, preference=None,
                  pref_rows=None) -> torch.Tensor | None:
    """What multiplies the per-token policy loss (grpo.algorithms.stabilisers), detached; None = 1:
    DeepSeek-V3.2's off-policy sequence mask (`algorithm.off_policy_mask.threshold`, judged against the
    sampler's log-probs, else pi_old as TRL) times the TIS / MIS weight pi_old / pi_sampler
    (`algorithm.rollout_correction`; needs the sampler's log-probs), times lambda-GRPO's f_i (with its
    gradient to lambda; `pref_rows`: the micro-batch's rows of `preference.step_inputs`).
    Shape: [n, T] -> [n, 1] | [n, T]."""
    weight = None if preference is None else preference.weights(*pref_rows)          # [n, 1]
    off_policy = algo.off_policy_mask                                                   # {name: measure, threshold}
    if off_policy.params.threshold is not None:
        behaviour = old if mb.sampling_logprobs is None else mb.sampling_logprobs
        m = off_policy_sequence_mask(mb.advantages, logp, behaviour, mb.completion_mask,
                                     off_policy.params.threshold, off_policy.name)
        weight = m if weight is None else weight * m
    correction = algo.rollout_correction                                                 # {name, min, max}
    if correction.name != "none" and mb.sampling_logprobs is not None:
        w = rollout_correction_weights(old, mb.sampling_logprobs, mb.completion_mask, correction.name,
                                       correction.params.min, correction.params.max)
        weight = w if weight is None else weight * w
    return weight


class SingleProcess:
    """The update's data-parallel hooks for one process: the model's own forward, the local loss
    normaliser, no gradient averaging, nothing to reduce. grpo.training.distributed.Parallel is the torchrun one."""

    world_size = 1

    def __init__(self, model: torch.nn.Module):
        self.policy = model

    def forward(self, input_ids, attention_mask, T, temperature, with_entropy, entropy_grad, chunk_size,
                model_inputs=None, host=None):
        return completion_logprobs(self.policy, input_ids, attention_mask, T, temperature, with_entropy=with_entropy,
                                   entropy_grad=entropy_grad, chunk_size=chunk_size, model_inputs=model_inputs,
                                   host=host)

    def no_sync(self, last: bool):
        return contextlib.nullcontext()

    def normalizer(self, agg, mask: torch.Tensor, L: int) -> float:
        return agg.normalizer(mask, L)

    def match_micro_batches(self, buckets: list) -> list:
        return buckets

    def reduce(self, sums: torch.Tensor) -> torch.Tensor:
        return sums

    def clip_grad_norm(self, params, max_norm: float) -> torch.Tensor:
        """The gradients' total norm, on the device (read with the step's statistics), after clipping to it."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


@dataclass(frozen=True)
class UpdateSettings:
    """How one policy update runs, besides the algorithm's keys (each field is described in :func:`policy_update`).

    temperature, micro_batch_size, max_grad_norm: `rollout.temperature`, `train.micro_batch_size`,
        `optim.max_grad_norm` (required: no silent defaults).
    norm_length, logprob_chunk_size, gradient_checkpointing, micro_batch_tokens, grad_buffer: the loss's constant L
        and the memory plan's choices (0 / None / False: off or automatic).
    entropy_coef, parallel, scaler, preference: this step's entropy bonus (None: the algorithm's) and the update's
        collaborators (None: one process, the optimizer's scaler, no lambda-GRPO).
    """

    temperature: float
    micro_batch_size: int
    max_grad_norm: float
    norm_length: int = 0
    logprob_chunk_size: int = 0
    gradient_checkpointing: bool | None = None
    micro_batch_tokens: int = 0
    grad_buffer: bool = False
    entropy_coef: float | None = None
    parallel: Any = None
    scaler: torch.amp.GradScaler | None = None
    preference: Any = None


def policy_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batch: TrainBatch,
                  algo: AlgorithmConfig, settings: UpdateSettings) -> UpdateStats:
    """One optimizer step on `batch`, accumulated over micro-batches, run as `settings` say.

    `norm_length` is the constant L of `seq-mean-token-sum-norm` (the trainer passes
    `algorithm.loss_norm_length`, else `rollout.max_new_tokens`). The KL penalty enters the loss only
    when `algo.kl_in == "loss"` (with "reward" the trainer has put it in the rewards). Token filters
    (overlong, top-rho entropy) arrive multiplied into `batch.completion_mask`.
    Micro-batches group rows of similar length, at most `micro_batch_size` rows (0 = no limit) and
    `micro_batch_tokens` padded tokens (<= 0 = no limit) each (the loss is a sum of per-row shares,
    so neither the grouping nor the order changes it). `logprob_chunk_size`: tokens per LM-head chunk (0 = auto, see
    grpo.modeling.logprobs); `gradient_checkpointing`: True/False switches layer checkpointing, None leaves it.
    `parallel` (a grpo.training.distributed.Parallel, torchrun only; None = :class:`SingleProcess`): `model` is
    then its policy; the forward goes through DDP / FSDP2, the normaliser is global, the loss is scaled
    by the world size (the wrappers average gradients over ranks) and the statistics are summed over ranks.

    Mixed precision (grpo.modeling.precision) is the caller's autocast: the forward passes and the loss run under
    it, each backward outside it. Under float16 autocast the loss is scaled by `scaler` (None = the one
    kept with the optimizer, :func:`grpo.modeling.precision.loss_scaler`) and the gradients unscaled before
    clipping; a step whose gradients overflow is skipped like any non-finite step and halves the scale.
    `preference` (grpo.algorithms.token_preference.TokenPreference, lambda-GRPO): its per-completion weights f_i
    multiply the policy term (with `token-mean`: the weighted token mean), and lambda gets its gradient.
    `entropy_coef`: the bonus coefficient of this step (None: ``algo.entropy_coef``; the adaptive controller's).
    `grad_buffer` (`cpu.grad_buffer`, the CPU runtime in one process): the policy's gradients start as zeroed views
    of one flat buffer (the runtime's hook, grpo.modeling.hooks.ModelHooks.grad_buffer), so they do not fragment the heap.
    """
    temperature, max_grad_norm, preference = settings.temperature, settings.max_grad_norm, settings.preference
    micro_batch_size, micro_batch_tokens = settings.micro_batch_size, settings.micro_batch_tokens
    logprob_chunk_size, grad_buffer = settings.logprob_chunk_size, settings.grad_buffer
    par = settings.parallel or SingleProcess(model)
    device = next(model.parameters()).device
    amp = active_dtype(device)                                # None: no autocast (train.precision fp32)
    scaler = (settings.scaler or loss_scaler(optimizer, device)) if amp == torch.float16 else None
    if amp is not None:
        torch.clear_autocast_cache()                          # casts made under no_grad carry no graph
    if settings.gradient_checkpointing is not None:
        set_gradient_checkpointing(model, settings.gradient_checkpointing)
    model.train()
    T = batch.completion_length
    beta = algo.beta if algo.kl_in == "loss" else 0.0
    norm_length = settings.norm_length or algo.loss_norm_length or batch.completion_length
    host = batch.host_view()                      # the rows on the host: structure decided without device reads
    normalizer = par.normalizer(AGGREGATIONS[algo.loss_agg_mode], host.completion_mask, norm_length)
    entropy_coef = algo.entropy_coef if settings.entropy_coef is None else settings.entropy_coef   # adaptive controller
    policy_params = PolicyLossParams.of_entry(algo.policy_loss.name, algo.policy_loss.params)   # the entry's own
    optimizer.zero_grad(set_to_none=True)
    if grad_buffer:
        model_hooks().grad_buffer([p for p in model.parameters() if p.requires_grad])
    prefs = preference.step_inputs(batch.completion_mask) if preference is not None else None   # h [N, G], pos [N]
    sums = None          # on the device: LOSS_STATS, then the entropy sum, the log-prob gap's sum and tokens
    buckets = par.match_micro_batches(bucketed_micro_batches(host.attention_mask, micro_batch_size,
                                                             micro_batch_tokens))   # FSDP2: same count on every rank
    with cast_frozen_linears(model, device), cast_trainable_linears(model, device):   # autocast: weights cast once
        for index, rows in enumerate(buckets):
            mb = batch.rows(rows)
            with par.no_sync(last=index == len(buckets) - 1):     # DDP: all-reduce gradients once, at the end
                logp, entropy = par.forward(mb.input_ids, mb.attention_mask, T, temperature, True,
                                            entropy_coef != 0, logprob_chunk_size,
                                            model_inputs=mb.model_inputs, host=mb.host)  # [n, T]; pixel_values
                old = logp.detach() if mb.old_logprobs is None else mb.old_logprobs  # mu == 1: ratio is 1, grad is not
                terms = grpo_loss(logp, old, mb.ref_logprobs, mb.advantages, mb.completion_mask,
                                  epsilon=algo.epsilon, epsilon_high=algo.epsilon_high,
                                  beta=beta if mb.beta is None or beta == 0 else mb.beta,   # per-domain beta [n]
                                  kl_estimator=algo.kl_estimator, agg_mode=algo.loss_agg_mode, normalizer=normalizer,
                                  importance_sampling_level=algo.importance_sampling_level,
                                  clip_ratio_c=policy_params.clip_ratio_c, entropy=entropy, entropy_coef=entropy_coef,
                                  kl_ratio_correction=algo.kl_ratio_correction, policy_loss=algo.policy_loss.name,
                                  policy_params=policy_params,
                                  policy_weight=policy_weight(algo, logp, old, mb, preference,
                                                              None if prefs is None else (prefs[0][rows], prefs[1][rows])))
                scaled = terms.loss * par.world_size              # x1 in one process (exact); wrappers average
                with paused(device):
                    (scaled if scaler is None else scaler.scale(scaled)).backward()
            gap = (logprob_gap_sums(logp, mb.sampling_logprobs, mb.completion_mask)   # mu = 1: the sampling policy
                   if mb.old_logprobs is None and mb.sampling_logprobs is not None else terms.stats.new_zeros(2))
            ent = (entropy.detach() * mb.completion_mask).sum().reshape(1)            # summed over active tokens
            part = torch.cat([terms.stats, ent.to(terms.stats.dtype), gap.to(terms.stats.dtype)])
            sums = part if sums is None else sums + part       # added on the device: no host sync per micro-batch
    model_hooks().after_update()       # the runtime's kept buffers (CPU: LM head, padding): not through the step or rollout
    if amp is not None:
        torch.clear_autocast_cache()   # free the weights' casts before the step's peak (and they would be stale)
    names = (*LOSS_STATS, "entropy_sum", "gap_sum", "gap_tokens")
    sums = par.reduce(sums.double() if sums is not None else torch.zeros(len(names), dtype=torch.float64,
                                                                        device=device))   # summed over ranks
    params = [p for p in model.parameters() if p.requires_grad]
    if scaler is not None:
        scaler.unscale_(optimizer)                            # true gradients (inf/nan where they overflowed)
    norm = par.clip_grad_norm(params, max_grad_norm if max_grad_norm > 0 else float("inf"))   # [] on the device
    *values, grad_norm = host_values(torch.cat([sums, norm.reshape(1).to(sums)]))   # the step's one device read
    stats = dict(zip(names, values))
    loss, tokens, gap_tokens = stats["loss"], stats["tokens"], stats["gap_tokens"]
    skipped = not (math.isfinite(loss) and math.isfinite(grad_norm))
    if skipped:
        optimizer.zero_grad(set_to_none=True)  # a non-finite step would poison the weights: drop it
    else:
        optimizer.step()
    if scaler is not None:
        scaler.update()                                       # overflow: halve the scale; else grow it slowly
    lr = optimizer.param_groups[0]["lr"]
    if not skipped:
        scheduler.step()
    tokens_ = max(tokens, 1.0)
    return UpdateStats(loss=loss, policy_loss=stats["policy"], kl_loss=stats["kl_term"],
                       kl=stats["kl_sum"] / tokens_ if beta > 0 else float("nan"),
                       clip_fraction=stats["clipped_sum"] / tokens_, entropy=stats["entropy_sum"] / tokens_,
                       grad_norm=grad_norm, lr=lr, skipped=skipped,
                       dual_clip_fraction=stats["dual_clipped_sum"] / tokens_, entropy_loss=stats["entropy_term"],
                       rollout_logprob_diff=stats["gap_sum"] / gap_tokens if gap_tokens else float("nan"),
                       clip_high_fraction=stats["clipped_high_sum"] / tokens_)
