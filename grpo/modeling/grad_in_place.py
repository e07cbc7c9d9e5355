"""Weight gradients accumulated into ``.grad`` in place (`train.grad_in_place`, the CPU runtime, one process).

Autograd computes each backward pass's weight gradient into a new tensor and then adds it to ``.grad``
(AccumulateGrad). With micro-batches that is, per linear layer and micro-batch, a fresh allocation of the
weight's size (on the CPU: new pages from the kernel at `train.mmap_threshold_mb` 1) and one more pass over it;
for an embedding, a dense [V, H] gradient built and added per pass. Here the backward writes into ``.grad``
directly: ``addmm_`` for a linear layer's dW += dY^T X (one GEMM), ``index_add_`` of the used rows for an
embedding. The values are autograd's (tests compare them in float64).

Measured on qwen2-100m (2 threads, AVX2 host): the weight gradients of its 84 projection shapes at 176 tokens
took 291 ms per micro-batch through autograd and 163 ms in place; the update's forward+backward of 16 x 88
tokens was 8-14 % faster (alternating passes in one process) and its peak RSS ~190 MiB lower.

Autograd receives None for these parameters, so their gradient hooks do not run: DDP and FSDP, which reduce
gradients from those hooks, keep plain layers (the runtime enables this only for a single process). The
parameters (leaves) are kept on ctx, not saved: under activation checkpointing a saved tensor comes back as a
recomputed alias, whose ``.grad`` is not the parameter's.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from grpo.modeling import heap


#: Bytes of the float32 temporary a mixed-dtype ``add_`` makes per block in :func:`add_upcast_`: under glibc's
#: mmap threshold (`train.mmap_threshold_mb`, >= 0.25 MiB), so the temporaries come from the heap, not new pages.
UPCAST_BLOCK_BYTES = 192 * 1024


def add_upcast_(acc: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """acc += g in place, where `g` may have a lower precision than `acc` (a bfloat16 gradient into a float32
    ``.grad``). A mixed-dtype ``add_`` converts `g` into a float32 temporary of its whole size first: at the
    weight's size that is fresh pages from the kernel every call at `train.mmap_threshold_mb` 1 (qwen2-100m,
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


def gradient_buffer(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Give each parameter in `params` that has no ``.grad`` a zeroed ``.grad`` that is a view of one flat buffer
    per (device, dtype) (`train.grad_buffer`). The backward passes then add into these views (autograd's
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
        flat = heap.zeros(sum(p.numel() for p in members), dtype, device)   # CPU: on huge pages (train.huge_pages)
        start = 0
        for p in members:
            p.grad = flat[start:start + p.numel()].view_as(p)
            start += p.numel()
        buffers.append(flat)
    return buffers


class _GradIntoLinearFn(torch.autograd.Function):
    """y = x W^T + b whose weight and bias gradients go straight into ``.grad`` (:func:`accumulate_grad`);
    autograd receives None for them, so no gradient hook of the parameters runs.

    The parameters (leaves) are kept on ctx, not saved: under activation checkpointing a saved tensor comes back
    as a recomputed alias, whose ``.grad`` is not the parameter's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias = weight, bias
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,), weight = ctx.saved_tensors, ctx.weight
        gx = grad @ weight if ctx.needs_input_grad[0] else None             # [..., K] = dY W
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            g2 = grad.reshape(-1, grad.shape[-1])                            # [M, N]
            if ctx.needs_input_grad[1]:
                accumulate_grad(weight, g2.t(), x.reshape(-1, x.shape[-1]))  # [N, K] += dY^T X
            if ctx.needs_input_grad[2]:
                accumulate_grad(ctx.bias, g2.sum(dim=0))                     # [N] += sum dY
        return gx, None, None


class _ReusedCast(torch.autograd.Function):
    """Forward: `cast` (the weight already cast to autocast's dtype); backward: its gradient, converted
    to the weight's dtype, goes to `weight`. A new node at every use, so the backward pass converts and
    accumulates each weight's gradient as soon as it is computed: autocast's own cached cast is one
    node created at the first use, which the autograd engine (newest nodes first) runs only at the end
    of every backward pass, holding all the weights' bfloat16 gradients until then (~+260 MiB of peak
    memory on qwen2-100m).

    With `into` (`train.grad_in_place`, a leaf weight) the low-precision gradient is added into
    ``weight.grad`` in place (:func:`accumulate_grad`; autograd receives None):
    converting it first allocated a float32 tensor of the weight's size per micro-batch, fresh pages from
    the kernel at `train.mmap_threshold_mb` 1 (qwen2-100m, bf16: ~0.8 s of a 3.4 s update in conversions
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
        """`x` in `dtype`, as an autograd node whose backward converts the gradient back (:class:`_ReusedCast`)."""
        if x.dtype == dtype:
            return x
        if self.source is None or self.source() is not x or self.version != x._version or self.cast.dtype != dtype:
            self.source, self.version, self.cast = weakref.ref(x), x._version, x.detach().to(dtype)
        return _ReusedCast.apply(x, self.cast) if x.requires_grad else self.cast


def cast_linear(module: torch.nn.Linear, x: torch.Tensor, into: bool) -> torch.Tensor:
    """`module`'s product under autocast with its once-per-update ``cast_weight`` (:class:`_ReusedCast`; `into`: the
    weight gradient goes into ``.grad`` in place) and its input cast through ``input_casts`` when set (shared by the
    linears reading `x`). The bias is left to autocast."""
    w = _ReusedCast.apply(module.weight, module.cast_weight, into)
    if module.input_casts is not None:
        x = module.input_casts.get(x, module.cast_weight.dtype)
    return F.linear(x, w, module.bias)                                   # autocast casts b (and x if not cast)


class GradIntoLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, state dict and isinstance) whose weight gradient is accumulated into
    ``.grad`` by one in-place GEMM per backward pass. Without autograd, for frozen or non-leaf weights the
    forward is ``F.linear``.

    Under autocast: ``cast_weight`` (set for the update by :func:`grpo.modeling.precision.cast_trainable_linears`)
    is the weight in autocast's dtype, made once per update; the product uses it through :class:`_ReusedCast`,
    whose backward adds the low-precision weight gradient into ``.grad`` at once, and its input is cast once
    for the linears that read it (``input_casts``, :class:`InputCasts`). Without ``cast_weight`` autocast's own
    cached cast applies (``F.linear``).
    """

    cast_weight: torch.Tensor | None = None
    input_casts: InputCasts | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if self.cast_weight is not None and torch.is_grad_enabled() and torch.is_autocast_enabled(x.device.type):
            return cast_linear(self, x, True)
        if (torch.is_grad_enabled() and (weight.requires_grad or (bias is not None and bias.requires_grad))
                and weight.is_leaf and (bias is None or bias.is_leaf)
                and not torch.is_autocast_enabled(x.device.type) and x.dtype == weight.dtype):
            return _GradIntoLinearFn.apply(x, weight, bias)
        return F.linear(x, weight, bias)


class _GradIntoEmbeddingFn(torch.autograd.Function):
    """weight[ids] whose gradient rows are added into weight.grad in place (index_add_), where autograd builds a
    dense [V, H] gradient per backward pass and adds it: the parameter is kept on ctx, as in _GradIntoLinearFn."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx = weight, padding_idx
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,), weight = ctx.saved_tensors, ctx.weight
        rows, flat = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])       # [M], [M, H]
        if ctx.padding_idx is not None:                                      # the padding row gets no gradient
            keep = rows != ctx.padding_idx
            rows, flat = rows[keep], flat[keep]
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, rows, flat.to(weight.grad.dtype))
        return None, None, None


class GradIntoEmbedding(torch.nn.Embedding):
    """An ``nn.Embedding`` whose weight gradient rows are added into ``.grad`` in place (`train.grad_in_place`):
    autograd's embedding backward builds a dense [V, H] gradient per backward pass (qwen2-100m: 96 MiB, ~30 ms
    per micro-batch) and adds it. Plain embeddings only (no max_norm, scale_grad_by_freq or sparse gradients)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (torch.is_grad_enabled() and w.requires_grad and w.is_leaf and self.max_norm is None
                and not self.scale_grad_by_freq and not self.sparse):
            return _GradIntoEmbeddingFn.apply(ids, w, self.padding_idx)
        return super().forward(ids)
