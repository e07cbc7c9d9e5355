"""The update's fused elementwise passes on the CPU (`cpu.elementwise_kernel`), in grpo's native library
(grpo/cpu/csrc/elementwise.c, built by grpo.cpu.native_gemm, called as the torch operators of grpo.cpu.ops): the
lean RMSNorm and SwiGLU MLP and their gradients (grpo.modeling.lean_layers) and the fused LM head's log-softmax,
entropy and dL/dlogits (grpo.modeling.fused_head), reached through grpo.modeling.hooks.Elementwise, each one pass over memory where torch's operators made several, with temporaries.

Measured on the 2-core AMD EPYC (Zen 5) host at qwen2-100m's shapes: the SwiGLU backward's elementwise work on a
[352, 2048] block took ~0.2 ms against ~4 ms through torch's operators (hot caches); in the update, where the
saved g and u come back from memory, numbers in docs/performance.md.

Every function here takes float32, contiguous CPU tensors; :func:`applies` says whether a call may use them (the
mode allows it, the library is built, the tensors qualify). Everything else keeps torch's operators, on any
device. Values equal torch's to float32 rounding: exp within 2 ulp, the same formulas (tests compare both
against float64).
"""

from __future__ import annotations

import torch

from grpo.cpu import native_gemm


def applies(*tensors: torch.Tensor | None) -> bool:
    """The native elementwise kernels serve these tensors: every tensor given (None skipped) is a plain tensor or
    parameter (no subclass: no DTensor), contiguous, float32, on the CPU (tested first: another device never builds
    or loads the library), `cpu.elementwise_kernel` allows them and the library is built here."""
    return all(t is None or (type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == torch.float32
                             and t.device.type == "cpu" and t.is_contiguous()) for t in tensors
               ) and native_gemm.active("elementwise")


def _check(name: str, *tensors: torch.Tensor) -> None:
    if not all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        raise ValueError(f"native_elementwise.{name}: needs contiguous float32 CPU tensors")
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors):
        raise ValueError(f"native_elementwise.{name}: shapes differ: {[tuple(t.shape) for t in tensors]}")


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x elementwise by the kernels' own exp (for tests and checks).  Shape: any -> the same"""
    _check("exp", x)
    return torch.ops.grpo.exp(x)


def swiglu_forward(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """a = silu(g) * u = g sigmoid(g) u.  Shape: g, u [M, I] -> a [M, I]"""
    _check("swiglu_forward", g, u)
    return torch.ops.grpo.swiglu_forward(g, u)


def swiglu_backward_(g: torch.Tensor, u: torch.Tensor, ga: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    """The SwiGLU's elementwise gradients in one pass, with s = sigmoid(g) and ga = dL/da for a = silu(g) u:
    dg = ga u s (1 + g (1 - s)) written over `ga`, du = ga silu(g), and a itself (the down projection's input,
    for its weight gradient). Returns (dg, du, a).  Shape: g, u, ga [M, I] -> three [M, I]"""
    _check("swiglu_backward_", g, u, ga)
    du, a = torch.ops.grpo.swiglu_backward_(g, u, ga)                          # dg written over ga
    return ga, du, a


def log_softmax_rows_(z: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None, logp: bool) -> None:
    """Per row of logits z: lse = log sum_v e^z_v into `lse`, with `entropy` H = -sum_v p_v log p_v into it,
    and with `logp` z itself overwritten by log p = z - lse. One row at a time (it stays in L2): the maximum,
    then S = sum e^(z - m) and T = sum e^(z - m) (z - m) in one pass, lse = m + log S, H = log S - T / S.

    Shape: z [n, V]; lse, entropy [n] (written)
    """
    _check("log_softmax_rows_", z)
    _check("log_softmax_rows_", lse, *(() if entropy is None else (entropy,)))
    if lse.shape != z.shape[:1]:
        raise ValueError(f"native_elementwise.log_softmax_rows_: lse {tuple(lse.shape)} for z {tuple(z.shape)}")
    torch.ops.grpo.log_softmax_rows_(z, lse, entropy, logp)


def head_grad_rows_(dz: torch.Tensor, lse: torch.Tensor | None, g_logp: torch.Tensor, g_entropy: torch.Tensor | None,
                    entropy: torch.Tensor | None, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """dL/dlogits of the fused head in place, per row: `dz` holds log p (or, with `lse`, the logits z, and
    log p = z - lse), p = e^(log p), y the row's token, gy its dL/dlogp_y, gh its dL/dH and H its entropy:

        dL/dz = -p (gy + gh (log p + H))  (-p gy without `g_entropy`),  + gy at y,  / temperature (unless 0 or 1)

    Shape: dz [n, V]; lse, g_logp, g_entropy, entropy [n]; tokens [n] int64 in [0, V) -> dz
    """
    n, v = dz.shape
    _check("head_grad_rows_", dz)
    vectors = [t for t in (lse, g_logp, g_entropy, entropy) if t is not None]
    _check("head_grad_rows_", *vectors)
    if g_logp.shape != (n,) or (g_entropy is not None and entropy is None):
        raise ValueError("native_elementwise.head_grad_rows_: g_logp [n] needed; g_entropy needs entropy")
    tokens = tokens.contiguous()
    if tokens.dtype != torch.int64 or tokens.shape != (n,):
        raise ValueError(f"native_elementwise.head_grad_rows_: tokens must be int64 [{n}]")
    if n and not bool(((tokens >= 0) & (tokens < v)).all()):
        raise IndexError(f"native_elementwise.head_grad_rows_: a token outside the vocabulary [0, {v})")
    tau = temperature if temperature > 0 else 1.0
    torch.ops.grpo.head_grad_rows_(dz, lse, g_logp, g_entropy, entropy, tokens, float(tau))
    return dz


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = w (x r), r = 1 / sqrt(mean(x^2) + eps) per row. Returns (y, r).  Shape: x [..., H], weight [H] ->
    y [..., H], r [..., 1]"""
    _check("rms_norm_forward", x)
    _check("rms_norm_forward", weight)
    h = x.shape[-1]
    if weight.shape != (h,):
        raise ValueError(f"native_elementwise.rms_norm_forward: weight {tuple(weight.shape)} for {h} features")
    return torch.ops.grpo.rms_norm_forward(x, weight, float(eps))


def rms_norm_backward(gy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, r: torch.Tensor, need_x: bool,
                      need_w: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """RMSNorm's gradients, with h = x r and gh = gy w: dL/dx = r (gh - h mean(gh h)) (`need_x`) and
    dL/dw = sum over rows of gy h (`need_w`, each column summed in row order by one thread).

    Shape: gy, x [..., H], weight [H], r [..., 1] -> dx [..., H] | None, dw [H] | None
    """
    _check("rms_norm_backward", gy, x)
    _check("rms_norm_backward", weight)
    gx, gw = torch.ops.grpo.rms_norm_backward(gy, x, weight, r.contiguous(), bool(need_x), bool(need_w))
    return gx if need_x else None, gw if need_w else None
