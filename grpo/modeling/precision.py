"""Mixed precision (`train.precision`): autocast of the forward passes, float32 master weights.

    fp32   no autocast: every op in the parameters' dtype (float32, or bfloat16 with model.dtype=bfloat16)
    bf16   torch.autocast(bfloat16): matmuls / attention in bfloat16, reductions and the loss in float32
    fp16   torch.autocast(float16) + a dynamic loss scaler (torch.amp.GradScaler) for the backward pass

The parameters, their gradients and the optimizer state stay in the parameters' own dtype (float32 by
default): autocast only casts each op's inputs. The autocast device type is the model's device type,
never a hard-coded one. Log-probs, the KL and the loss are computed in float32 whatever the precision
(grpo.modeling.logprobs upcasts the logits before the log-softmax).

Where it applies: the trainer enters :func:`autocast` around the experience stage (rollout, reference
and old-policy passes) and around the update; the rollout alone can run in another precision
(`rollout.precision`, :func:`rollout_autocast`); :func:`grpo.training.update.policy_update` reads the ambient
autocast (:func:`active_dtype`) to run backward outside it, scale the fp16 loss and drop autocast's
cached weight casts once the weights change. :func:`cast_frozen_linears` (reference, LoRA base) and
:func:`cast_trainable_linears` (the update's oneDNN linears) cast weights once per pass where autocast
would cast them at every call or hold their gradients too long (docs/performance.md).
"""

from __future__ import annotations

import contextlib

import torch

from grpo.config.schema import ROLLOUT_PRECISIONS

#: `train.precision` -> the autocast dtype (None = no autocast).
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of `train.precision` (None for fp32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision must be one of {' | '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def autocast(device: torch.device, precision: str):
    """The context the forward passes of a run execute in: ``torch.autocast`` on `device`'s type with
    the dtype of `precision`, or a no-op for fp32. Leaving it drops autocast's cached weight casts."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def rollout_precision(rollout: str, train: str) -> str:
    """The precision the rollout's forward passes run in: `rollout.precision` (fp32 | bf16 | fp16, or verl's
    float32 | bfloat16 | float16), `auto` = `train.precision`."""
    if rollout not in ROLLOUT_PRECISIONS:
        raise ValueError(f"rollout.precision must be one of {' | '.join(ROLLOUT_PRECISIONS)}, got {rollout!r}")
    name = ROLLOUT_PRECISIONS[rollout]
    return train if name == "auto" else name


def rollout_autocast(device: torch.device, rollout: str, train: str):
    """The context the rollout runs in, inside the run's own (:func:`autocast` of `train.precision`): nothing
    more when both agree; autocast to `rollout.precision`'s dtype when it differs (a bf16 sampler beside a
    float32 update, as verl's rollout.dtype); autocast switched off for an fp32 rollout under bf16 / fp16
    training. The sampler's log-probs are then those of the rollout's numerics: `rollout/logprob_diff` (alias
    `rollout/logp_diff`) measures the gap and `algorithm.rollout_correction` (TIS / MIS) corrects for it."""
    name = rollout_precision(rollout, train)
    if name == train:
        return contextlib.nullcontext()
    dtype = PRECISIONS[name]
    kind = torch.device(device).type
    return torch.autocast(device_type=kind, enabled=False) if dtype is None else torch.autocast(kind, dtype=dtype)


def active_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast currently casts to on `device`'s type, None when autocast is off there."""
    kind = torch.device(device).type
    if not torch.amp.is_autocast_available(kind):              # meta (the stand-in accelerator): no autocast
        return None
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def paused(device: torch.device):
    """Autocast off on `device`'s type inside (the backward pass: PyTorch recommends running it outside
    autocast; each op's backward then uses the dtype its forward ran in). Its cache is kept."""
    kind = torch.device(device).type
    if not torch.amp.is_autocast_available(kind):              # meta: nothing to pause
        return contextlib.nullcontext()
    return torch.autocast(device_type=kind, enabled=False)


def _frozen_linear_params(model: torch.nn.Module):
    """(module, name, parameter) of every frozen float32 weight or bias of `model`'s linear layers that
    is a plain tensor (sharded DTensor weights are left to autocast)."""
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for name in ("weight", "bias"):
            p = module._parameters.get(name)
            if p is None or p.requires_grad or p.dtype != torch.float32 or type(p.data) is not torch.Tensor:
                continue
            yield module, name, p


def _swap_frozen_linears(model: torch.nn.Module, dtype: torch.dtype) -> list[tuple[torch.nn.Module, str, torch.nn.Parameter]]:
    """Replace each frozen float32 linear weight/bias of `model` by a `dtype` copy (a tensor shared by two
    layers is cast once; a tied LM head gets its own copy, the embedding keeps the float32 matrix).
    Returns (module, name, original parameter) for each swap."""
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    copies: dict[int, torch.nn.Parameter] = {}
    for module, name, p in list(_frozen_linear_params(model)):
        if id(p) not in copies:
            copies[id(p)] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
        module._parameters[name] = copies[id(p)]
        swapped.append((module, name, p))
    return swapped


@contextlib.contextmanager
def cast_frozen_linears(model: torch.nn.Module, device: torch.device):
    """Under autocast on `device`: the frozen float32 weights and biases of `model`'s linear layers are
    swapped for copies in the autocast dtype until the block ends, then put back.

    Autocast casts a linear's float32 weight at every call and caches the cast only for weights that
    require grad, so a frozen model (the reference policy, LoRA's base weights) would pay a full cast
    of its weights at every micro-batch, LM-head chunk and decode step (on qwen2-100m a cast of the
    tied 25M-parameter head alone takes ~27 ms at one thread). The copies give the same products as
    autocast's own casts; embeddings and norms keep their float32 weights (a tied LM head gets its own
    copy, the embedding keeps the float32 matrix). Sharded (DTensor) weights are left to autocast.
    A no-op without autocast.
    """
    dtype = active_dtype(device)
    swapped = _swap_frozen_linears(model, dtype) if dtype is not None else []
    try:
        yield
    finally:
        for module, name, p in swapped:
            module._parameters[name] = p


def store_frozen_linears(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """For good: the frozen float32 linear weights and biases of `model` (a frozen reference copy) are
    replaced by `dtype` copies and the float32 ones freed, as :func:`cast_frozen_linears` would swap them
    at every pass. Its forward passes then give the same values under `dtype` autocast (and must run
    under it), holding half the memory for those weights (qwen2-100m: -96 MiB net of the tied head's
    own copy). Returns the number of tensors replaced."""
    return len(_swap_frozen_linears(model, dtype))


@contextlib.contextmanager
def cast_trainable_linears(model: torch.nn.Module, device: torch.device):
    """Under autocast on `device`: each trainable float32 weight of `model`'s linears that take a once-per-update
    cast (a ``cast_weight`` attribute: the CPU runtime's oneDNN grpo.cpu.kernels.DnnLinear, or aten's
    grpo.cpu.grad_in_place.GradIntoLinear with `cpu.grad_in_place`) is cast to the autocast dtype once for the block, and their forward passes with
    autograd use that cast (the update's micro-batches, forward and recomputed).

    Autocast would cast each weight once too (it caches casts of trainable weights), but its cached cast
    is a single autograd node whose backward the engine runs last, so every weight's low-precision
    gradient stays alive to the end of each backward pass; here each use is a new node and the gradient
    is converted and accumulated at once (measured on qwen2-100m: update peak -260 MiB, and not slower).
    Linears reading the same input (q / k / v, gate / up) share one cast of it, a new autograd node per
    use as for the weights (:class:`grpo.modeling.in_place.InputCasts`): autocast saves a copy per linear.
    For GradIntoLinear (the aten linears, where oneDNN is no faster) this was measured on qwen2-100m and a 299.5M
    model, bf16 update, Intel Xeon host: see docs/performance.md. Other layers (``nn.Linear``, CUDA) keep
    autocast's cache. A no-op without autocast.
    """
    from grpo.modeling.in_place import InputCasts

    dtype = active_dtype(device)
    cast: list[torch.nn.Linear] = []                        # the linears with a cast_weight slot
    copies: dict[int, torch.Tensor] = {}                    # the tied LM head / embedding matrix is cast once
    inputs = InputCasts()                                   # q / k / v (gate / up) share their input's cast
    if dtype is not None:
        for module in model.modules():
            w = module.weight if isinstance(module, torch.nn.Linear) and hasattr(module, "cast_weight") else None
            if w is None or not w.requires_grad or w.dtype != torch.float32 or type(w.data) is not torch.Tensor:
                continue
            if id(w) not in copies:
                copies[id(w)] = w.detach().to(dtype)
            module.cast_weight, module.input_casts = copies[id(w)], inputs
            cast.append(module)
    try:
        yield
    finally:
        for module in cast:
            module.cast_weight = module.input_casts = None


def loss_scaler(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.amp.GradScaler:
    """The dynamic loss scaler of fp16 training for `optimizer`, created on first use and kept on the
    optimizer, so its scale adapts across steps (halved after a step with inf/nan gradients, doubled
    after 2000 clean ones). Saved in checkpoints (optimizer.pt), so a resumed run goes on at the same scale."""
    scaler = getattr(optimizer, "grpo_loss_scaler", None)
    if scaler is None:
        scaler = torch.amp.GradScaler(torch.device(device).type)
        optimizer.grpo_loss_scaler = scaler
    return scaler
