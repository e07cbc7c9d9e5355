"""Gradient accumulation in place and once-per-update casts: plain torch helpers of the model code (the fused
LM head, the lean layers, grpo.modeling.precision) and of a runtime's linear classes (grpo.cpu.grad_in_place).

Autograd computes each backward pass's weight gradient into a new tensor and then adds it to ``.grad``;
:func:`accumulate_grad` writes the product into ``.grad`` directly (one ``addmm_``), with autograd's values.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F


#: Bytes of the float32 temporary a mixed-dtype ``add_`` makes per block in :func:`add_upcast_`: under glibc's
#: mmap threshold (`cpu.mmap_threshold_mb`, >= 0.25 MiB), so the temporaries come from the heap, not new pages.
UPCAST_BLOCK_BYTES = 192 * 1024


def add_upcast_(acc: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """acc += g in place, where `g` may have a lower precision than `acc` (a bfloat16 gradient into a float32
    ``.grad``). A mixed-dtype ``add_`` converts `g` into a float32 temporary of its whole size first: at the
    weight's size that is fresh pages from the kernel every call at `cpu.mmap_threshold_mb` 1 (qwen2-100m,
    bf16 update: ~2 ms per [2048, 768] gradient, against ~0.15 ms block by block). So `g` is added in blocks of
    rows whose temporaries stay under :data:`UPCAST_BLOCK_BYTES`. Same values as ``acc.add_(g)``.

    Shape: acc [N, ...] and g of the same shape -> acc
    """
    if g.dtype == acc.dtype or acc.dim() == 0 or acc.numel() * acc.element_size() <= UPCAST_BLOCK_BYTES:
        return acc.add_(g)
    rows = max(1, UPCAST_BLOCK_BYTES // (acc[0].numel() * acc.element_size()))
    for start in range(0, acc.shape[0], rows):
        acc[start:start + rows].add_(g[start:start + rows])
    return acc


def accumulate_grad(param: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None = None) -> None:
    """param.grad += a @ b (or += a when `b` is None), in place: the product is written into the gradient by one
    ``addmm_``, where autograd would allocate it, then add it. The first product makes the gradient.
    `a` may have a lower precision than the parameter (an autocast gradient): it is added in the parameter's
    dtype (:func:`add_upcast_`).

    Shape: param [N, K] with a [N, M], b [M, K]; or param [N] (or [N, K]) with `a` of its shape
    """
    if param.grad is None:
        param.grad = (a @ b if b is not None else a).to(param.dtype, copy=b is None)  # never an alias of `a`
    elif b is not None:
        param.grad.addmm_(a, b)
    else:
        add_upcast_(param.grad, a)


def flat_gradients(params: list[torch.Tensor], zeros=torch.zeros) -> list[torch.Tensor]:
    """Give each parameter in `params` that has no ``.grad`` a zeroed ``.grad`` that is a view of one flat buffer
    per (device, dtype) (`cpu.grad_buffer`). The backward passes then add into these views (autograd's
    AccumulateGrad and the in-place layers above both add into an existing ``.grad``), with the same values.

    Why (CPU, glibc): made one by one during the first micro-batch's backward, the gradients land in the holes
    that micro-batch's freed activations leave, and the next micro-batch's activations no longer fit there; the
    heap grows by part of a micro-batch per micro-batch. One buffer is a single allocation; above glibc's mmap
    threshold (at most 32 MiB) it is outside the heap and back to the OS as soon as the gradients are dropped after
    the step.

    Returns the buffers (their views are the gradients). Shape: each buffer [sum of its parameters' numel]
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            groups.setdefault((p.device, p.dtype), []).append(p)
    buffers = []
    for (device, dtype), members in groups.items():
        flat = zeros(sum(p.numel() for p in members), dtype=dtype, device=device)   # `zeros`: the runtime's allocation
        start = 0
        for p in members:
            p.grad = flat[start:start + p.numel()].view_as(p)
            start += p.numel()
        buffers.append(flat)
    return buffers


class ReusedCast(torch.autograd.Function):
    """Forward: `cast` (the weight already cast to autocast's dtype); backward: its gradient, converted
    to the weight's dtype, goes to `weight`. A new node at every use, so the backward pass converts and
    accumulates each weight's gradient as soon as it is computed: autocast's own cached cast is one
    node created at the first use, which the autograd engine (newest nodes first) runs only at the end
    of every backward pass, holding all the weights' bfloat16 gradients until then (~+260 MiB of peak
    memory on qwen2-100m).

    With `into` (`cpu.grad_in_place`, a leaf weight) the low-precision gradient is added into
    ``weight.grad`` in place (:func:`accumulate_grad`; autograd receives None):
    converting it first allocated a float32 tensor of the weight's size per micro-batch, fresh pages from
    the kernel at `cpu.mmap_threshold_mb` 1 (qwen2-100m, bf16: ~0.8 s of a 3.4 s update in conversions
    and AccumulateGrad)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, cast: torch.Tensor, into: bool = False) -> torch.Tensor:
        ctx.dtype = weight.dtype
        ctx.weight = weight if into and weight.is_leaf else None  # the leaf on ctx, not saved (as grad_in_place)
        return cast

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.weight is not None:
            accumulate_grad(ctx.weight, grad)
            return None, None, None
        return grad.to(ctx.dtype), None, None


class InputCasts:
    """The last layer input cast to autocast's dtype, shared by the linears that read the same tensor
    (q / k / v, gate / up): autocast casts the input at every call and each product saves its own
    copy for the backward pass (3 bfloat16 copies of the normed hidden state per attention block
    where float32 saves 1). One entry (a weak reference to the input and its version counter), so a
    cast is reused only for the very tensor, unchanged, it was made from."""

    def __init__(self):
        self.source = None                                  # weakref to the float32 input
        self.version = -1
        self.cast: torch.Tensor | None = None

    def get(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`x` in `dtype`, as an autograd node whose backward converts the gradient back (:class:`ReusedCast`)."""
        if x.dtype == dtype:
            return x
        if self.source is None or self.source() is not x or self.version != x._version or self.cast.dtype != dtype:
            self.source, self.version, self.cast = weakref.ref(x), x._version, x.detach().to(dtype)
        return ReusedCast.apply(x, self.cast) if x.requires_grad else self.cast


def cast_linear(module: torch.nn.Linear, x: torch.Tensor, into: bool) -> torch.Tensor:
    """`module`'s product under autocast with its once-per-update ``cast_weight`` (:class:`ReusedCast`; `into`: the
    weight gradient goes into ``.grad`` in place) and its input cast through ``input_casts`` when set (shared by the
    linears reading `x`). The bias is left to autocast."""
    w = ReusedCast.apply(module.weight, module.cast_weight, into)
    if module.input_casts is not None:
        x = module.input_casts.get(x, module.cast_weight.dtype)
    return F.linear(x, w, module.bias)                                   # autocast casts b (and x if not cast)


