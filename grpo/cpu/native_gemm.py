"""grpo's own CPU GEMMs on AVX-512 (grpo/cpu/csrc/decode_gemm.c): the rollout's decode-step products
(`cpu.decode_kernel`, :func:`pack` and :func:`matmul`) and the update's weight gradients added into ``.grad``
(`cpu.grad_kernel`, :func:`grad_accumulate`); and the modes of every use of the one library that holds them with
the update's fused elementwise passes (csrc/elementwise.c, `cpu.elementwise_kernel`, grpo.cpu.native_elementwise)
and short-sequence attention (csrc/attention.c, `cpu.attention_kernel`, grpo.cpu.native_attention).

At a decode step's few rows (16 for G = 8 and 2 prompts) every weight is read once from memory for 16 multiply-adds.
oneDNN's packed kernel, which the rollout used for these products, measured on the 2-core AMD EPYC (Zen 5) host as if
it read the weights and then multiplied, never both at once: the products of one qwen2-100m decode step took
bytes / read bandwidth + flops / GEMM peak at 4, 8, 16 and 32 rows. The kernel here packs each weight once per
rollout into panels of 16 output columns and prefetches 16 KiB ahead of its multiply-adds, so the two overlap
(bench/decode_floor.py; numbers in docs/performance.md).

The library is built and loaded by grpo.cpu.native_library; the kernels are the torch operators of
grpo.cpu.ops.
"""

from __future__ import annotations

import torch

from grpo.cpu.native_library import library, unavailable_reason  # noqa: F401  (this module's names too)
from grpo.cpu.ops import LANES  # noqa: F401  (importing grpo.cpu.ops registers torch.ops.grpo.*)
#: Above this many rows oneDNN's packed GEMM is as fast or faster (qwen2-100m's decode products, Zen 5:
#: 0.97x at 64 rows, 1.06x slower at 128), so the rollout packs for oneDNN instead.
MAX_ROWS = 64
#: `cpu.decode_kernel` and `cpu.grad_kernel` values.
MODES = ("auto", "native", "onednn")
#: What each use of the kernels is called in the config.
KEYS = {"decode": "cpu.decode_kernel", "grad": "cpu.grad_kernel", "elementwise": "cpu.elementwise_kernel",
        "attention": "cpu.attention_kernel"}
#: Each use's values: its fallback is oneDNN's GEMMs or torch's operators.
USE_MODES = {"decode": MODES, "grad": MODES, "elementwise": ("auto", "native", "torch"),
             "attention": ("auto", "native", "torch")}

_modes = {"decode": "auto", "grad": "auto", "elementwise": "auto", "attention": "auto"}


class PanelWeight:
    """A float32 weight [N, K] packed for :func:`matmul`: ``panels`` [ceil(N / 16), K, 16], output columns in
    panels of 16 (the last zero-padded). Read-only, for one rollout (no autograd)."""

    __slots__ = ("panels", "shape", "dtype", "device")
    is_mkldnn = False

    def __init__(self, panels: torch.Tensor, shape: torch.Size):
        self.panels, self.shape = panels, shape
        self.dtype, self.device = panels.dtype, panels.device


def configure(decode: str = "auto", grad: str = "auto", elementwise: str = "auto", attention: str = "auto") -> None:
    """Set `cpu.decode_kernel` (`decode`), `cpu.grad_kernel` (`grad`), `cpu.elementwise_kernel`
    (`elementwise`) and `cpu.attention_kernel` (`attention`) for this process, each auto (the native kernel where
    it builds, else the fallback), native (the native kernel; an error naming the reason where it cannot run) or the
    fallback: onednn, or torch for the elementwise passes and attention."""
    for use, mode in (("decode", decode), ("grad", grad), ("elementwise", elementwise), ("attention", attention)):
        if mode not in USE_MODES[use]:
            raise ValueError(f"{KEYS[use]}: '{mode}' is not one of {' | '.join(USE_MODES[use])}")
        if mode == "native" and library() is None:
            raise RuntimeError(f"{KEYS[use]}: native is not available here: {unavailable_reason()}")
    _modes.update(decode=decode, grad=grad, elementwise=elementwise, attention=attention)


def active(use: str = "decode") -> bool:
    """Whether the native kernel serves `use`: decode (rollouts pack their float32 weights for :func:`matmul`),
    grad (weight gradients accumulate through :func:`grad_accumulate`), elementwise (the update's fused passes,
    grpo.cpu.native_elementwise) or attention (grpo.cpu.native_attention): its mode allows it and it is
    built."""
    return _modes[use] not in ("onednn", "torch") and library() is not None


def pack(weight: torch.Tensor) -> PanelWeight:
    """`weight` packed into panels of 16 output columns (a copy; no autograd).

    Shape: weight [N, K] float32 on the CPU -> PanelWeight (panels [ceil(N / 16), K, 16])
    """
    if library() is None:
        raise RuntimeError(f"cpu.decode_kernel: native is not available here: {unavailable_reason()}")
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"native_gemm.pack: needs a 2-D float32 CPU weight, got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    w = weight.detach().contiguous()
    return PanelWeight(torch.ops.grpo.panel_pack(w), w.shape)                  # [ceil(N / 16), K, 16]


def matmul(x: torch.Tensor, weight: PanelWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for a :func:`pack`-ed W, on the rollout's no-grad path.

    Shape: x [..., K] float32, weight PanelWeight of [N, K], bias [N] or None -> [..., N]
    """
    n, k = weight.shape
    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("native_gemm.matmul: a rollout kernel without autograd; x requires grad")
    if x.shape[-1] != k:
        raise ValueError(f"native_gemm.matmul: x has {x.shape[-1]} features, the weight {k}")
    x2 = x.reshape(-1, k).to(torch.float32).contiguous()                     # [M, K]
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    out = torch.ops.grpo.panel_matmul(x2, weight.panels, n, b)               # [M, N]
    return out.view(*x.shape[:-1], n)


def grad_accumulate(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """target += a^T b in place, both operands read where they are (no transposed copies, no product temporary):
    a weight gradient dW += dY^T X. Each element is summed over the rows in order by one thread. `overwrite`:
    target = a^T b (what adding to zeros gives, without the zero fill; target's old values are never read).

    Shape: target [N, K], a [M, N], b [M, K], all float32 contiguous on the CPU -> target
    """
    m, n = a.shape
    if b.shape[0] != m or target.shape != (n, b.shape[1]):
        raise ValueError(f"native_gemm.grad_accumulate: target {tuple(target.shape)} != a^T b of a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}")
    if not all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in (target, a, b)):
        raise ValueError("native_gemm.grad_accumulate: needs contiguous float32 CPU tensors")
    if m and target.numel():
        torch.ops.grpo.grad_accumulate_(target, a, b, overwrite)
    elif overwrite:
        target.zero_()
    return target
