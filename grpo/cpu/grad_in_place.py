"""Weight gradients accumulated into ``.grad`` in place (`cpu.grad_in_place`, the CPU runtime, one process).

Autograd computes each backward pass's weight gradient into a new tensor and then adds it to ``.grad``
(AccumulateGrad). With micro-batches that is, per linear layer and micro-batch, a fresh allocation of the
weight's size (on the CPU: new pages from the kernel at `cpu.mmap_threshold_mb` 1) and one more pass over it;
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

import torch
import torch.nn.functional as F

from grpo.cpu import heap
from grpo.modeling.in_place import InputCasts, accumulate_grad, cast_linear, flat_gradients


def gradient_buffer(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """grpo.modeling.in_place.flat_gradients with CPU buffers on transparent huge pages (`cpu.huge_pages`,
    grpo.cpu.heap.zeros): the CPU runtime's gradient-buffer hook. Shape: each buffer [sum of its parameters' numel]"""
    return flat_gradients(params, heap.zeros)


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


class GradIntoLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, state dict and isinstance) whose weight gradient is accumulated into
    ``.grad`` by one in-place GEMM per backward pass. Without autograd, for frozen or non-leaf weights the
    forward is ``F.linear``.

    Under autocast: ``cast_weight`` (set for the update by :func:`grpo.modeling.precision.cast_trainable_linears`)
    is the weight in autocast's dtype, made once per update; the product uses it through :class:`grpo.modeling.in_place.ReusedCast`,
    whose backward adds the low-precision weight gradient into ``.grad`` at once, and its input is cast once
    for the linears that read it (``input_casts``, :class:`InputCasts`). Without ``cast_weight`` autocast's own
    cached cast applies (``F.linear``).
    """

    cast_weight: torch.Tensor | None = None
    input_casts: InputCasts | None = None
    plain_linear = True                     # grpo.modeling.hooks.plain_linear: nn.Linear's math and parameters
    grad_into = True                        # grpo.modeling.hooks.grad_into: weight gradients go into .grad

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
    """An ``nn.Embedding`` whose weight gradient rows are added into ``.grad`` in place (`cpu.grad_in_place`):
    autograd's embedding backward builds a dense [V, H] gradient per backward pass (qwen2-100m: 96 MiB, ~30 ms
    per micro-batch) and adds it. Plain embeddings only (no max_norm, scale_grad_by_freq or sparse gradients)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (torch.is_grad_enabled() and w.requires_grad and w.is_leaf and self.max_norm is None
                and not self.scale_grad_by_freq and not self.sparse):
            return _GradIntoEmbeddingFn.apply(ids, w, self.padding_idx)
        return super().forward(ids)
