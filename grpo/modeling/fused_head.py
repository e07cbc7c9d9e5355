"""The LM head, temperature and log-softmax of a micro-batch's completion tokens as one autograd node that
reuses one [chunk, V] logits buffer for every chunk, forward and backward.

The chunked path (grpo.modeling.logprobs.chunked_head) checkpoints each chunk: its forward makes the chunk's
logits, their temperature-scaled copy and the log-softmax, and the backward recomputes them and adds the
gradients of log-softmax, temperature and GEMM, each a fresh [chunk, V] tensor (32 MiB at 256 tokens x 32k
vocabulary). On the CPU, at `train.mmap_threshold_mb` 1, every one of them is new pages from the kernel. Here
the logits of chunk c are written into one buffer by ``torch.mm(out=)`` and every later step works in place
on it; the backward recomputes the logits into the same buffer, turns them into dL/dz in place and writes
dL/dh and dL/dW from it. Only the per-token log-normaliser and entropy ([M] each) are kept between passes.

With z = (h W^T + b) / tau for one token of target y (tau the sampling temperature), log p = z - lse(z),
p = softmax(z), the outputs and their gradients are

    logp_y = z_y - lse(z)                   d logp_y / dz = e_y - p
    H = -sum_v p_v log p_v                  dH / dz_v = -p_v (log p_v + H)

so dL/dz = g_y (e_y - p) - g_H p (log p + H), then dL/dlogits = dL/dz / tau, dL/dh = dL/dlogits W,
dL/dW = dL/dlogits^T h, dL/db = sum dL/dlogits. The weight gradient goes into ``.grad`` in place
(grpo.modeling.grad_in_place.accumulate_grad) when the head is a GradIntoLinear (`train.grad_in_place`),
else to autograd, which accumulates it (and runs DDP's hooks) as for any layer.

Used for a plain float32 / float64 ``nn.Linear`` head (or GradIntoLinear) without hooks, outside autocast;
everything else (oneDNN-switched or LoRA-wrapped heads, sharded weights, bf16) keeps the checkpointed chunks.
"""

from __future__ import annotations

import torch

from grpo.modeling.grad_in_place import GradIntoLinear, accumulate_grad


def applies(head: torch.nn.Module, hidden: torch.Tensor) -> bool:
    """This head can run through :func:`head_logprobs`: a plain (or in-place-gradient) linear layer, no hooks,
    weights of the hidden states' float32 / float64 dtype on their device, a plain tensor (not sharded), no
    autocast."""
    if type(head) not in (torch.nn.Linear, GradIntoLinear) or head._forward_hooks or head._forward_pre_hooks:
        return False
    w, b = head.weight, head.bias
    return (type(w.data) is torch.Tensor and w.dtype == hidden.dtype and hidden.dtype in (torch.float32, torch.float64)
            and w.device == hidden.device and (b is None or type(b.data) is torch.Tensor)
            and not torch.is_autocast_enabled(hidden.device.type))


def _logits_into(buf: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 temperature: float) -> torch.Tensor:
    """z = (h W^T + b) / tau written into `buf` ([n, V], the first n rows of the workspace)."""
    torch.mm(h, weight.t(), out=buf)
    if bias is not None:
        buf.add_(bias)
    if temperature > 0 and temperature != 1.0:
        buf.div_(temperature)
    return buf


def _workspace(hidden: torch.Tensor, V: int, chunk: int, with_probs: bool):
    """Rows per chunk k, the [k, V] logits buffer and (`with_probs`) a second one for probabilities, on the
    hidden states' device and dtype."""
    k = max(1, min(chunk, hidden.shape[0]))
    return k, hidden.new_empty(k, V), hidden.new_empty(k, V) if with_probs else None


class _HeadLogprobs(torch.autograd.Function):
    """(hidden [M, H], weight [V, H], bias [V] | None, tokens [M]) -> logp_y [M], entropy H [M] (zeros if not
    asked); see the module docstring for the gradients. The parameters are kept on ctx (as GradIntoLinear's)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, with_entropy, chunk, into):
        ctx.set_materialize_grads(False)
        logp, entropy, lse = _forward(hidden, weight, bias, tokens, temperature, with_entropy, chunk)
        ctx.save_for_backward(hidden, tokens, lse, entropy)
        ctx.weight, ctx.bias, ctx.temperature, ctx.chunk, ctx.into = weight, bias, temperature, chunk, into
        ctx.with_entropy = with_entropy
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        hidden, tokens, lse, entropy = ctx.saved_tensors
        weight, bias, tau, into = ctx.weight, ctx.bias, ctx.temperature, ctx.into
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        M, V = hidden.shape[0], weight.shape[0]
        if g_logp is None:
            g_logp = hidden.new_zeros(M)
        if not ctx.with_entropy:
            g_entropy = None                                                   # its output was constant zeros
        dh = torch.empty_like(hidden) if need_h else None
        dw = torch.zeros_like(weight) if need_w and not into else None
        db = torch.zeros_like(bias) if need_b and not into else None
        k, buf, probs = _workspace(hidden, V, ctx.chunk, g_entropy is not None)
        for s in range(0, M, k):
            e = min(s + k, M)
            h, gy = hidden[s:e], g_logp[s:e, None]                            # [n, H], [n, 1]
            dz = _logits_into(buf[:e - s], h, weight, bias, tau).sub_(lse[s:e, None])      # log p  [n, V]
            if g_entropy is None:
                dz.exp_().mul_(-gy)                                            # -g_y p
            else:
                p = torch.exp(dz, out=probs[:e - s])
                dz.add_(entropy[s:e, None]).mul_(g_entropy[s:e, None]).add_(gy).mul_(p).neg_()  # -p (g_y + g_H (log p + H))
            dz.scatter_add_(1, tokens[s:e, None], gy)                         # + g_y e_y
            if tau > 0 and tau != 1.0:
                dz.div_(tau)                                                   # dL/dlogits
            if need_h:
                torch.mm(dz, weight, out=dh[s:e])                              # [n, H] = dL/dlogits W
            if need_w:                                                         # [V, H] += dL/dlogits^T h
                accumulate_grad(weight, dz.t(), h) if into else dw.addmm_(dz.t(), h)
            if need_b:
                accumulate_grad(bias, dz.sum(dim=0)) if into else db.add_(dz.sum(dim=0))
        return dh, dw, db, None, None, None, None, None


def _forward(hidden, weight, bias, tokens, temperature, with_entropy, chunk):
    """logp_y [M], entropy [M] (zeros if not asked), lse [M] of every row, `chunk` rows at a time in one buffer."""
    M, V = hidden.shape[0], weight.shape[0]
    k, buf, probs = _workspace(hidden, V, chunk, with_entropy)
    logp, lse, entropy = hidden.new_empty(M), hidden.new_empty(M), hidden.new_zeros(M)
    with torch.no_grad():
        for s in range(0, M, k):
            e = min(s + k, M)
            z = _logits_into(buf[:e - s], hidden[s:e], weight, bias, temperature)     # [n, V]
            lse[s:e] = torch.logsumexp(z, dim=-1)
            logp[s:e] = z.gather(1, tokens[s:e, None]).squeeze(1) - lse[s:e]
            if with_entropy:
                z.sub_(lse[s:e, None])                                                 # log p
                entropy[s:e] = -torch.exp(z, out=probs[:e - s]).mul_(z).sum(dim=-1)   # -sum p log p
    return logp, entropy, lse


def head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                  with_entropy: bool, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax((hidden W^T + b) / temperature)[tokens] and the entropies, `chunk_size` rows of logits at a
    time through one buffer; with autograd, one node whose backward recomputes each chunk's logits into the
    same buffer (module docstring). The head must pass :func:`applies`.

    Shape:
        hidden: [M, H], tokens: [M]  ->  logp [M], entropy [M] (zeros if not asked), in the hidden states' dtype
    """
    weight, bias = head.weight, head.bias
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))
    if not grad:
        logp, entropy, _ = _forward(hidden, weight, bias, tokens, temperature, with_entropy, chunk_size)
        return logp, entropy
    into = type(head) is GradIntoLinear and weight.is_leaf and (bias is None or bias.is_leaf)
    return _HeadLogprobs.apply(hidden, weight, bias, tokens, temperature, with_entropy, chunk_size, into)
