"""The LM head, temperature and log-softmax of a micro-batch's completion tokens as one autograd node that
reuses one [chunk, V] logits buffer for every chunk, forward and backward.

The chunked path (grpo.modeling.logprobs.chunked_head) checkpoints each chunk: its forward makes the chunk's
logits, their temperature-scaled copy and the log-softmax, and the backward recomputes them and adds the
gradients of log-softmax, temperature and GEMM, each a fresh [chunk, V] tensor (32 MiB at 256 tokens x 32k
vocabulary). On the CPU, at `cpu.mmap_threshold_mb` 1, every one of them is new pages from the kernel. Here
the logits of chunk c are written into one buffer by ``torch.mm(out=)`` and every later step works in place
on it; the backward recomputes the logits into the same buffer, turns them into dL/dz in place and writes
dL/dh and dL/dW from it. Only the per-token log-normaliser and entropy ([M] each) are kept between passes, and,
with the entropy (the update's call), the buffer itself: it still holds log p of the forward's last chunk, so the
backward starts with that chunk and recomputes only the others, unless something wrote into the buffer in between
(its version counter says). At a 32k vocabulary the default chunk (32 MiB of logits) is 256 tokens, so a
micro-batch of up to 256 completion tokens recomputes no logits (qwen2-100m forward+backward -4.6 %, Xeon host).

With z = (h W^T + b) / tau for one token of target y (tau the sampling temperature), log p = z - lse(z),
p = softmax(z), the outputs and their gradients are

    logp_y = z_y - lse(z)                   d logp_y / dz = e_y - p
    H = -sum_v p_v log p_v                  dH / dz_v = -p_v (log p_v + H)

so dL/dz = g_y (e_y - p) - g_H p (log p + H), then dL/dlogits = dL/dz / tau, dL/dh = dL/dlogits W,
dL/dW = dL/dlogits^T h, dL/db = sum dL/dlogits. The weight gradient goes into ``.grad`` in place
(grpo.modeling.in_place.accumulate_grad) when the head says so (grpo.modeling.hooks.grad_into: the CPU runtime's
linears with `cpu.grad_in_place`),
else to autograd, which accumulates it (and runs DDP's hooks) as for any layer.

Used for a plain float32 / float64 ``nn.Linear`` head (or a runtime's class of the same math,
grpo.modeling.hooks.plain_linear) without hooks, outside autocast. A head class with its own GEMMs
(grpo.modeling.hooks.layer_gemm; on the CPU the oneDNN linear of `cpu.cpu_matmul`) keeps its products there; oneDNN
has no ``out=``: each product is made in blocks small enough to come from the heap (grpo.cpu.kernels.BLOCK_BYTES) and
copied or added into place (logits in vocabulary-column blocks, dL/dW in vocabulary-row blocks), its rows padded
to a multiple of :data:`ROW_MULTIPLE` so oneDNN builds a kernel for few shapes. Measured on the AVX-512 host at
V = 151,936, H = 768: logits 270-430 GFLOP/s against MKL's 115-185 into the buffer, dL/dW 230-370 against
``addmm_``'s 220. The buffers are kept from call to call on the CPU (the runtime's buffer hook, grpo.cpu.workspace).
And on the CPU under bfloat16 autocast (`train.precision` bf16) for those and the oneDNN-switched DnnLinear, whose
cast weight the update made once (grpo.modeling.precision.cast_trainable_linears). There the three products run
in bfloat16 as autocast's would (logits rounded to bfloat16, then upcast into the float32 buffer; dL/dlogits
rounded to bfloat16 for dL/dh and dL/dW) through a second, bfloat16 buffer, and the float32 work between them is
the same in-place sequence. Everything else (LoRA-wrapped heads, sharded weights, float16) keeps the checkpointed
chunks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpo.modeling.precision import active_dtype
from grpo.modeling.hooks import LayerGemm, grad_into, installed, layer_gemm, plain_linear
from grpo.modeling.in_place import accumulate_grad, add_upcast_


def lowp_dtype(hidden: torch.Tensor) -> torch.dtype | None:
    """bfloat16 when the head's products run in it here (CPU autocast in bfloat16), else None."""
    kind = hidden.device.type
    on = kind == "cpu" and torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16
    return torch.bfloat16 if on else None


def applies(head: torch.nn.Module, hidden: torch.Tensor) -> bool:
    """This head can run through :func:`head_logprobs`: a plain, in-place-gradient or oneDNN linear layer, no hooks,
    weights of the hidden states' float32 / float64 dtype on their device, a plain tensor (not sharded), no
    autocast; or, under CPU bfloat16 autocast, float32 hidden states and a plain, in-place or oneDNN linear head
    with float32 or bfloat16 weights."""
    if not plain_linear(head) or head._forward_hooks or head._forward_pre_hooks:
        return False
    w, b = head.weight, head.bias
    if type(w.data) is not torch.Tensor or w.device != hidden.device or (b is not None and type(b.data) is not torch.Tensor):
        return False
    if lowp_dtype(hidden) is not None:
        return hidden.dtype == torch.float32 and w.dtype in (torch.float32, torch.bfloat16)
    return (w.dtype == hidden.dtype and hidden.dtype in (torch.float32, torch.float64)
            and active_dtype(hidden.device) is None)


def fast_gemm(head: torch.nn.Module, hidden: torch.Tensor) -> LayerGemm | None:
    """The head class's own GEMMs (grpo.modeling.hooks.layer_gemm: the CPU runtime's oneDNN linear) when they serve
    this call (float32 CPU plain tensors, no autocast), else None: torch's products."""
    gemm = layer_gemm(head)
    return gemm if gemm is not None and gemm.serves(hidden, head.weight) else None


#: Vocabulary rows per bfloat16 weight-gradient product of :meth:`_Products.add_grad_weight` (3 MiB at H = 768).
VOCAB_BLOCK = 2048
#: oneDNN path: rows per product padded to a multiple of this (a kernel per shape, ~0.2 MiB each).
ROW_MULTIPLE = 16


class _Products:
    """The head's three products, in the weight's dtype or (`lowp`) in bfloat16 through a reused bfloat16 buffer.

    Shape: weight [V, H]; `low` a [k, V] buffer in `lowp` (None without it)
    """

    def __init__(self, head_weight: torch.Tensor, cast: torch.Tensor | None, bias: torch.Tensor | None,
                 lowp: torch.dtype | None, k: int, gemm: LayerGemm | None = None):
        self.lowp, self.gemm = lowp, gemm if lowp is None else None
        self.shape, self.dtype = head_weight.shape, head_weight.dtype
        if lowp is None:
            self.w, self.b, self.low = head_weight, bias, None
        else:                                            # the update's one cast (DnnLinear.cast_weight), else one here
            self.w = cast if cast is not None and cast.dtype == lowp else head_weight.detach().to(lowp)
            self.b = bias.detach().to(lowp) if bias is not None else None
            self.low = installed().buffer("head.low", head_weight, (k, head_weight.shape[0]), lowp)

    def logits_into(self, buf: torch.Tensor, h: torch.Tensor, temperature: float) -> torch.Tensor:
        """z = (h W^T + b) / tau written into `buf` ([n, V], the first n rows of the workspace)."""
        if self.gemm is not None:                        # [n, cols] blocks of heap memory, copied into place
            w, b, cols = self.w.detach(), self.b, self.gemm.block_size(h.shape[0], buf.shape[1])
            for v in range(0, buf.shape[1], cols):
                buf[:, v:v + cols].copy_(self.gemm.mm(h, w[v:v + cols], None if b is None else b.detach()[v:v + cols]))
            out = buf
        elif self.lowp is None:
            out = torch.mm(h, self.w.t(), out=buf)
        else:
            out = torch.mm(h.to(self.lowp), self.w.t(), out=self.low[:buf.shape[0]])  # rounded as autocast's
        if self.b is not None and self.gemm is None:
            out.add_(self.b)
        if self.lowp is not None:
            buf.copy_(out)
        if temperature > 0 and temperature != 1.0:
            buf.div_(temperature)
        return buf

    def operand(self, dz: torch.Tensor) -> torch.Tensor:
        """dL/dlogits as the backward products read it: itself, or rounded into the bfloat16 buffer."""
        return dz if self.lowp is None else self.low[:dz.shape[0]].copy_(dz)

    def grad_hidden_into(self, out: torch.Tensor, dz: torch.Tensor) -> None:
        """out = dL/dlogits W.  Shape: dz [n, V] (from :meth:`operand`) -> out [n, H]"""
        if self.gemm is not None:
            out.copy_(self.gemm.mm(dz, self.w.detach().t()))
        elif self.lowp is None:
            torch.mm(dz, self.w, out=out)
        else:
            out.copy_(torch.mm(dz, self.w))

    def new_grad_weight(self, dz: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """dL/dW = dz^T h as a new float32 tensor of the weight's shape: stored by the head class's GEMMs (the CPU
        runtime's native kernel writes it with no zero fill), else zeros plus :meth:`add_grad_weight`.
        Shape: dz [n, V], h [n, H] -> [V, H]"""
        target = torch.empty(self.shape, dtype=self.dtype, device=h.device)
        if self.gemm is not None:
            return self.gemm.store_product_(target, dz, h)
        self.add_grad_weight(target.zero_(), dz, h)
        return target

    def add_grad_weight(self, target: torch.Tensor, dz: torch.Tensor, h: torch.Tensor) -> None:
        """target += dL/dW = dz^T h, in place: one ``addmm_``; in bfloat16, :data:`VOCAB_BLOCK` vocabulary rows at a
        time, each block's product added in float32 (a [V, H] bfloat16 product would be a 50 MiB temporary at
        qwen2-100m's head, at the update's peak); by the head class's GEMMs (:class:`LayerGemm`) where they serve.
        Shape: target [V, H], dz [n, V], h [n, H]"""
        if self.gemm is not None:
            self.gemm.add_product_(target, dz, h)
            return
        if self.lowp is None:
            target.addmm_(dz.t(), h)
            return
        h = h.to(self.lowp)
        for v in range(0, target.shape[0], VOCAB_BLOCK):
            add_upcast_(target[v:v + VOCAB_BLOCK], torch.mm(dz[:, v:v + VOCAB_BLOCK].t(), h))


def _workspace(hidden: torch.Tensor, V: int, chunk: int, with_probs: bool):
    """Rows per chunk k, the [k, V] logits buffer and (`with_probs`) a second one for probabilities, on the
    hidden states' device and dtype, kept between calls where the runtime's buffer hook keeps them (the CPU's:
    qwen2 768x12 at 32k, with :func:`_logsumexp`: update 3.38 -> 3.1 s)."""
    k, hooks = max(1, min(chunk, hidden.shape[0])), installed()
    return (k, hooks.buffer("head.logits", hidden, (k, V)),
            hooks.buffer("head.probs", hidden, (k, V)) if with_probs else None)


def _logsumexp(z: torch.Tensor, scratch: torch.Tensor | None) -> torch.Tensor:
    """lse(z) per row as ``torch.logsumexp`` computes it (max m, infinite maxima taken as 0, m + log sum exp(z - m)),
    with exp(z - m) written into `scratch` ([n, V]), or into `z` itself when `scratch` is None (z is then lost);
    ``torch.logsumexp`` makes two new [n, V] temporaries per call.  Shape: z [n, V] -> [n]"""
    m = z.amax(dim=-1, keepdim=True)                                          # [n, 1]
    m.masked_fill_(m.abs() == float("inf"), 0.0)
    e = torch.sub(z, m, out=scratch) if scratch is not None else z.sub_(m)
    return e.exp_().sum(dim=-1).log_().add_(m.squeeze(-1))


class _HeadLogprobs(torch.autograd.Function):
    """(hidden [M, H], weight [V, H], bias [V] | None, tokens [M]) -> logp_y [M], entropy H [M] (zeros if not
    asked); see the module docstring for the gradients. The parameters are kept on ctx (as GradIntoLinear's)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, with_entropy, chunk, into, cast, lowp, gemm):
        ctx.set_materialize_grads(False)
        logp, entropy, lse, last = _forward(hidden, weight, bias, tokens, temperature, with_entropy, chunk, cast, lowp,
                                            gemm)
        ctx.save_for_backward(hidden, tokens, lse, entropy)
        ctx.kept = None if last is None else (*last, last[1]._version)  # (start, log p view, its version)
        ctx.weight, ctx.bias, ctx.temperature, ctx.chunk, ctx.into = weight, bias, temperature, chunk, into
        ctx.with_entropy, ctx.cast, ctx.lowp, ctx.gemm = with_entropy, cast, lowp, gemm
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
        g_logp = g_logp.contiguous()                                           # [M] (a sum's gradient is expanded)
        g_entropy = None if g_entropy is None else g_entropy.contiguous()
        dh = torch.empty_like(hidden) if need_h else None
        dw = torch.zeros_like(weight) if need_w and not into else None
        db = torch.zeros_like(bias) if need_b and not into else None
        ew = installed().elementwise                                           # cpu.elementwise_kernel
        native = ew is not None and ew.applies(hidden, g_logp, g_entropy, entropy)
        k, buf, probs = _workspace(hidden, V, ctx.chunk, g_entropy is not None and not native)
        products = _Products(weight, ctx.cast, bias, ctx.lowp, k, ctx.gemm)
        kept = ctx.kept if ctx.kept is not None and ctx.kept[1]._version == ctx.kept[2] else None
        for s in reversed(range(0, M, k)):                                     # the forward's last chunk first
            e = min(s + k, M)
            h, gy = hidden[s:e], g_logp[s:e, None]                            # [n, H], [n, 1]
            if kept is not None and s == kept[0]:
                dz, shift = kept[1], None                                      # log p as the forward left it
            else:
                dz, shift = products.logits_into(buf[:e - s], h, tau), lse[s:e]          # logits  [n, V]
            if native:                                                         # one pass per row, in L2
                ew.head_grad_rows_(dz, shift, g_logp[s:e], None if g_entropy is None else g_entropy[s:e],
                                   entropy[s:e], tokens[s:e], tau)
            else:
                if shift is not None:
                    dz.sub_(shift[:, None])                                    # log p
                if g_entropy is None:
                    dz.exp_().mul_(-gy)                                        # -g_y p
                else:
                    p = torch.exp(dz, out=probs[:e - s])
                    # -p (g_y + g_H (log p + H))
                    dz.add_(entropy[s:e, None]).mul_(g_entropy[s:e, None]).add_(gy).mul_(p).neg_()
                dz.scatter_add_(1, tokens[s:e, None], gy)                     # + g_y e_y
                if tau > 0 and tau != 1.0:
                    dz.div_(tau)                                               # dL/dlogits
            dzp = products.operand(dz) if need_h or need_w else dz             # bf16 products: rounded once
            if need_h:
                products.grad_hidden_into(dh[s:e], dzp)                        # [n, H] = dL/dlogits W
            if need_w and into and weight.grad is None:          # [V, H] = dL/dlogits^T h, once per update
                weight.grad = products.new_grad_weight(dzp, h)
            elif need_w:                                                       # [V, H] += dL/dlogits^T h
                products.add_grad_weight(weight.grad if into else dw, dzp, h)
            if need_b:
                accumulate_grad(bias, dz.sum(dim=0)) if into else db.add_(dz.sum(dim=0))
        return dh, dw, db, None, None, None, None, None, None, None, None


def _forward(hidden, weight, bias, tokens, temperature, with_entropy, chunk, cast=None, lowp=None, gemm=None):
    """logp_y [M], entropy [M] (zeros if not asked), lse [M] of every row, `chunk` rows at a time in one buffer;
    with the entropy, also (start, log p [n, V]) of the last chunk, which the buffer still holds (else None)."""
    M, V = hidden.shape[0], weight.shape[0]
    logp, lse, entropy = hidden.new_empty(M), hidden.new_empty(M), hidden.new_zeros(M)
    ew = installed().elementwise                                       # cpu.elementwise_kernel
    native = ew is not None and ew.applies(hidden)
    k, buf, probs = _workspace(hidden, V, chunk, with_entropy and not native)
    last = None
    with torch.no_grad():
        products = _Products(weight, cast, bias, lowp, k, gemm)
        for s in range(0, M, k):
            e = min(s + k, M)
            z = products.logits_into(buf[:e - s], hidden[s:e], temperature)          # [n, V]
            z_y = z.gather(1, tokens[s:e, None]).squeeze(1)                           # [n]
            if native:                           # lse, H and (with H) log p in place, a row at a time in L2
                ew.log_softmax_rows_(z, lse[s:e], entropy[s:e] if with_entropy else None, with_entropy)
            else:
                lse[s:e] = _logsumexp(z, probs[:e - s] if with_entropy else None)     # z kept only if needed
                if with_entropy:
                    z.sub_(lse[s:e, None])                                             # log p
                    entropy[s:e] = -torch.exp(z, out=probs[:e - s]).mul_(z).sum(dim=-1)  # -sum p log p
            logp[s:e] = z_y - lse[s:e]
            if with_entropy:
                last = (s, z)
    return logp, entropy, lse, last


def head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                  with_entropy: bool, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax((hidden W^T + b) / temperature)[tokens] and the entropies, `chunk_size` rows of logits at a
    time through one buffer; with autograd, one node whose backward recomputes each chunk's logits into the
    same buffer (module docstring). The head must pass :func:`applies`.

    Shape:
        hidden: [M, H], tokens: [M]  ->  logp [M], entropy [M] (zeros if not asked), in the hidden states' dtype
    """
    weight, bias, M = head.weight, head.bias, hidden.shape[0]
    lowp, cast = lowp_dtype(hidden), getattr(head, "cast_weight", None)
    gemm = None if lowp is not None else fast_gemm(head, hidden)
    if gemm is not None:             # rows in whole multiples: zero rows get zero gradients, outputs trimmed back
        pad = -M % ROW_MULTIPLE
        hidden, tokens = (F.pad(hidden, (0, 0, 0, pad)), F.pad(tokens, (0, pad))) if pad else (hidden, tokens)
        chunk_size = max(ROW_MULTIPLE, chunk_size // ROW_MULTIPLE * ROW_MULTIPLE)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))
    if not grad:
        logp, entropy, _, _ = _forward(hidden, weight, bias, tokens, temperature, with_entropy, chunk_size, cast, lowp,
                                       gemm)
        return logp[:M], entropy[:M]
    into = grad_into(head) and weight.is_leaf and (bias is None or bias.is_leaf)
    logp, entropy = _HeadLogprobs.apply(hidden, weight, bias, tokens, temperature, with_entropy, chunk_size, into,
                                        cast, lowp, gemm)
    return logp[:M], entropy[:M]
