"""grpo's native CPU kernels (grpo/cpu/csrc, built by grpo.cpu.native_library) as torch operators: ``torch.ops.grpo.*``.

Each kernel is an operator of the ``grpo`` library (:func:`op`: a schema, the CPU kernel, a fake implementation
that only makes outputs of the right shapes), so the operators run under meta and fake tensors (shape propagation, ``torch.compile`` tracing)
without the library, and show in the profiler under their own names (``grpo::swiglu_forward``, ...). The real
implementations call the library through ctypes on CPU tensors; the callers (grpo.cpu.native_gemm,
native_elementwise, native_attention) check arguments first and keep their autograd in ``autograd.Function``s that
call these operators. Operators whose name ends in ``_`` write into the arguments their schema marks as mutated.
"""

from __future__ import annotations

import ctypes

import torch
from torch.library import Library

from grpo.cpu import native_library

#: Output columns per packed panel of the decode kernel (one AVX-512 vector of float32).
LANES = 16


#: The ``grpo`` operator library. Its operators are defined with ``Library.define`` / ``impl`` rather than
#: ``torch.library.custom_op``: a call then costs ~2.5 us over the kernel instead of ~11 us (the decode kernel runs
#: several times per layer per token).
LIB = Library("grpo", "DEF")


def op(schema: str):
    """Define ``grpo::<schema>`` with the decorated function as its CPU kernel; the function gets a
    ``register_fake`` decorator for the meta / fake implementation. Autograd stays with the callers'
    ``autograd.Function``s."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)

    def wrap(fn):
        LIB.impl(name, fn, "CPU")

        def register_fake(fake):
            torch.library.register_fake(f"grpo::{name}", fake, lib=LIB)
            return fake

        fn.register_fake = register_fake
        return fn

    return wrap


def _lib() -> ctypes.CDLL:
    lib = native_library.library()
    if lib is None:
        raise RuntimeError(f"grpo's native kernels are not available here: {native_library.unavailable_reason()}")
    return lib


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _longs(values) -> ctypes.Array:
    return (ctypes.c_long * len(values))(*values)


# --- GEMMs (csrc/decode_gemm.c) ---------------------------------------------------------------------------------

@op("panel_pack(Tensor weight) -> Tensor")
def panel_pack(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous float32 weight [N, K] packed into panels [ceil(N / 16), K, 16] of 16 output columns."""
    n, k = weight.shape
    panels = weight.new_empty((n + LANES - 1) // LANES, k, LANES)
    _lib().grpo_panel_pack(weight.data_ptr(), n, k, panels.data_ptr())
    return panels


@panel_pack.register_fake
def _(weight):
    n, k = weight.shape
    return weight.new_empty((n + LANES - 1) // LANES, k, LANES)


@op("panel_matmul(Tensor x, Tensor panels, int n, Tensor? bias) -> Tensor")
def panel_matmul(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] (contiguous float32) times a packed weight of N output columns (+ bias [N]) -> [M, N]."""
    m, k = x.shape
    out = x.new_empty(m, n)
    if m and _lib().grpo_panel_matmul(x.data_ptr(), m, k, panels.data_ptr(), n, _ptr(bias), out.data_ptr()):
        raise MemoryError(f"grpo::panel_matmul: no memory for the {m} x {k} input's transposed copy")
    return out


@panel_matmul.register_fake
def _(x, panels, n, bias):
    return x.new_empty(x.shape[0], n)


@op("grad_accumulate_(Tensor(a!) target, Tensor a, Tensor b, bool overwrite) -> ()")
def grad_accumulate_(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, overwrite: bool) -> None:
    """target [N, K] += a^T b (a [M, N], b [M, K]); `overwrite`: target = a^T b (its old values never read)."""
    m, n = a.shape
    _lib().grpo_grad_accumulate(target.data_ptr(), a.data_ptr(), b.data_ptr(), m, n, b.shape[1], overwrite)


@grad_accumulate_.register_fake
def _(target, a, b, overwrite):
    return None


# --- elementwise passes (csrc/elementwise.c) --------------------------------------------------------------------

@op("exp(Tensor x) -> Tensor")
def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x by the kernels' own exp (tests and checks)."""
    y = torch.empty_like(x)
    _lib().grpo_exp(x.data_ptr(), y.data_ptr(), x.numel())
    return y


@exp.register_fake
def _(x):
    return torch.empty_like(x)


@op("swiglu_forward(Tensor g, Tensor u) -> Tensor")
def swiglu_forward(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """a = silu(g) * u.  Shape: g, u [M, I] -> [M, I]"""
    a = torch.empty_like(g)
    _lib().grpo_swiglu_forward(g.data_ptr(), u.data_ptr(), a.data_ptr(), g.numel())
    return a


@swiglu_forward.register_fake
def _(g, u):
    return torch.empty_like(g)


@op("swiglu_backward_(Tensor g, Tensor u, Tensor(a!) ga) -> (Tensor, Tensor)")
def swiglu_backward_(g: torch.Tensor, u: torch.Tensor, ga: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dg written over `ga`; returns (du, a).  Shape: g, u, ga [M, I] -> two [M, I]"""
    du, a = torch.empty_like(g), torch.empty_like(g)
    _lib().grpo_swiglu_backward(g.data_ptr(), u.data_ptr(), ga.data_ptr(), du.data_ptr(), a.data_ptr(), g.numel())
    return du, a


@swiglu_backward_.register_fake
def _(g, u, ga):
    return torch.empty_like(g), torch.empty_like(g)


@op("log_softmax_rows_(Tensor(a!) z, Tensor(b!) lse, Tensor(c!)? entropy, bool logp) -> ()")
def log_softmax_rows_(z: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None, logp: bool) -> None:
    """Per row of z [n, V]: lse [n], entropy [n] (when given) and, with `logp`, z overwritten by log p."""
    _lib().grpo_log_softmax_rows(z.data_ptr(), z.shape[0], z.shape[1], lse.data_ptr(), _ptr(entropy), int(logp))


@log_softmax_rows_.register_fake
def _(z, lse, entropy, logp):
    return None


@op("head_grad_rows_(Tensor(a!) dz, Tensor? lse, Tensor g_logp, Tensor? g_entropy, Tensor? entropy, "
    "Tensor tokens, float temperature) -> ()")
def head_grad_rows_(dz: torch.Tensor, lse: torch.Tensor | None, g_logp: torch.Tensor, g_entropy: torch.Tensor | None,
                    entropy: torch.Tensor | None, tokens: torch.Tensor, temperature: float) -> None:
    """dL/dlogits of the fused LM head written over dz [n, V] (grpo.cpu.native_elementwise.head_grad_rows_)."""
    n, v = dz.shape
    _lib().grpo_head_grad_rows(dz.data_ptr(), n, v, _ptr(lse), g_logp.data_ptr(), _ptr(g_entropy),
                               None if g_entropy is None else _ptr(entropy), tokens.data_ptr(), temperature)


@head_grad_rows_.register_fake
def _(dz, lse, g_logp, g_entropy, entropy, tokens, temperature):
    return None


@op("rms_norm_forward(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)")
def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = w (x r), r = 1 / sqrt(mean(x^2) + eps) per row.  Shape: x [..., H], weight [H] -> y [..., H], r [..., 1]"""
    h = x.shape[-1]
    y, r = torch.empty_like(x), x.new_empty(*x.shape[:-1], 1)
    _lib().grpo_rms_norm_forward(x.data_ptr(), weight.data_ptr(), y.data_ptr(), r.data_ptr(), x.numel() // max(h, 1),
                                 h, eps)
    return y, r


@rms_norm_forward.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty(*x.shape[:-1], 1)


@op("rms_norm_backward(Tensor gy, Tensor x, Tensor weight, Tensor r, bool need_x, "
    "bool need_w) -> (Tensor, Tensor)")
def rms_norm_backward(gy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, r: torch.Tensor, need_x: bool,
                      need_w: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm's (dx [..., H], dw [H]); an output not asked for (`need_x`, `need_w`) is an empty tensor."""
    h = x.shape[-1]
    gx = torch.empty_like(x) if need_x else x.new_empty(0)
    gw = torch.empty_like(weight) if need_w else weight.new_empty(0)
    _lib().grpo_rms_norm_backward(gy.data_ptr(), x.data_ptr(), weight.data_ptr(), r.data_ptr(),
                                  gx.data_ptr() if need_x else None, gw.data_ptr() if need_w else None,
                                  x.numel() // max(h, 1), h)
    return gx, gw


@rms_norm_backward.register_fake
def _(gy, x, weight, r, need_x, need_w):
    return (torch.empty_like(x) if need_x else x.new_empty(0)), (torch.empty_like(weight) if need_w
                                                                   else weight.new_empty(0))


# --- attention (csrc/attention.c) -------------------------------------------------------------------------------

@op("attention_forward(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> (Tensor, Tensor)")
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale q k^T + mask) v: q [B, Hq, T, D], k / v [B, Hk, T, D] (head dimension contiguous), mask
    [B, T, T] uint8 or None (causal) -> o [B, T, Hq, D], lse [B, Hq, T]."""
    B, Hq, T, D = q.shape
    o, lse = q.new_empty(B, T, Hq, D), q.new_empty(B, Hq, T)
    if _lib().grpo_attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), _longs([B, Hq, k.shape[1], T, D]),
                                     *[_longs(t.stride()[:3]) for t in (q, k, v)], _ptr(mask), scale, o.data_ptr(),
                                     lse.data_ptr()):
        raise MemoryError("grpo::attention_forward: no memory for the attention's work buffers")
    return o, lse


@attention_forward.register_fake
def _(q, k, v, mask, scale):
    B, Hq, T, D = q.shape
    return q.new_empty(B, T, Hq, D), q.new_empty(B, Hq, T)


@op("attention_backward(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, Tensor o, "
    "Tensor do, Tensor lse) -> (Tensor, Tensor, Tensor)")
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                       o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention's (dq [B, Hq, T, D] contiguous, dk, dv [B, Hk, T, D]) from the saved o and lse; do contiguous."""
    B, Hq, T, D = q.shape
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)
    if _lib().grpo_attention_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), _longs([B, Hq, k.shape[1], T, D]),
                                      *[_longs(t.stride()[:3]) for t in (q, k, v)], _ptr(mask), scale, o.data_ptr(),
                                      do.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()):
        raise MemoryError("grpo::attention_backward: no memory for the attention's work buffers")
    return dq, dk, dv


@attention_backward.register_fake
def _(q, k, v, mask, scale, o, do, lse):
    return torch.empty_like(q, memory_format=torch.contiguous_format), k.new_empty(k.shape), v.new_empty(v.shape)
