"""grpo's own CPU GEMMs on AVX-512 (grpo/modeling/csrc/decode_gemm.c): the rollout's decode-step products
(`rollout.decode_kernel`, :func:`pack` and :func:`matmul`) and the update's weight gradients added into ``.grad``
(`train.grad_kernel`, :func:`grad_accumulate`); and the build of the one library that holds them with the update's
fused elementwise passes (csrc/elementwise.c, `train.elementwise_kernel`, grpo.modeling.native_elementwise) and
short-sequence attention (csrc/attention.c, `train.attention_kernel`, grpo.modeling.native_attention).

At a decode step's few rows (16 for G = 8 and 2 prompts) every weight is read once from memory for 16 multiply-adds.
oneDNN's packed kernel, which the rollout used for these products, measured on the 2-core AMD EPYC (Zen 5) host as if
it read the weights and then multiplied, never both at once: the products of one qwen2-100m decode step took
bytes / read bandwidth + flops / GEMM peak at 4, 8, 16 and 32 rows. The kernel here packs each weight once per
rollout into panels of 16 output columns and prefetches 16 KiB ahead of its multiply-adds, so the two overlap
(bench/decode_floor.py; numbers in docs/performance.md).

It is C, compiled on first use with the machine's C compiler (``$CC``, else ``cc``; ``-O3 -march=native -fopenmp``)
into a cache directory (``$GRPO_KERNEL_CACHE``, else ``~/.cache/grpo/kernels``; one file per source, flags,
compiler and CPU) and loaded through ctypes. It runs on torch's own OpenMP thread pool: it is used only when the
process already has GNU OpenMP loaded (torch's CPU wheels do), so no second thread pool competes for the cores.
Where any condition fails (not x86-64 Linux with AVX-512, no compiler, torch built with another OpenMP), `auto`
keeps oneDNN and :func:`unavailable_reason` says why; `native` is then an error.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("decode_gemm.c", "elementwise.c",
                                                                          "attention.c"))
#: Included by the sources (part of the cache key).
HEADERS = (SOURCES[0].with_name("simd_exp.h"),)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
#: Output columns per packed panel (one AVX-512 vector of float32).
LANES = 16
#: Above this many rows oneDNN's packed GEMM is as fast or faster (qwen2-100m's decode products, Zen 5:
#: 0.97x at 64 rows, 1.06x slower at 128), so the rollout packs for oneDNN instead.
MAX_ROWS = 64
#: `rollout.decode_kernel` and `train.grad_kernel` values.
MODES = ("auto", "native", "onednn")
#: What each use of the kernels is called in the config.
KEYS = {"decode": "rollout.decode_kernel", "grad": "train.grad_kernel", "elementwise": "train.elementwise_kernel",
        "attention": "train.attention_kernel"}
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
    """Set `rollout.decode_kernel` (`decode`), `train.grad_kernel` (`grad`), `train.elementwise_kernel`
    (`elementwise`) and `train.attention_kernel` (`attention`) for this process, each auto (the native kernel where
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
    grpo.modeling.native_elementwise) or attention (grpo.modeling.native_attention): its mode allows it and it is
    built."""
    return _modes[use] not in ("onednn", "torch") and library() is not None


def unavailable_reason() -> str | None:
    """Why the native kernel cannot run in this process, or None when it can."""
    return _load()[1]


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built and loaded on the first call; None where it cannot run here."""
    return _load()[0]


def _gnu_openmp_loaded() -> bool:
    """torch's OpenMP runtime is GNU's (libgomp), already mapped: the kernel's own libgomp.so.1 resolves to it."""
    try:
        return "libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _cache_dir() -> Path:
    root = os.environ.get("GRPO_KERNEL_CACHE")
    return Path(root) if root else Path(os.path.expanduser("~")) / ".cache" / "grpo" / "kernels"


def _cpu_signature() -> str:
    """The CPU's model and flags (``-march=native`` compiles for them), so a cache shared between hosts rebuilds."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    keep = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(keep))


def _compile(cc: str, target: Path) -> None:
    """Compile SOURCES into `target` (written beside it first and renamed: concurrent processes never load half)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode:
            raise RuntimeError(f"{cc} failed on {', '.join(p.name for p in SOURCES)}: "
                               f"{proc.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.lru_cache(maxsize=None)
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None, f"needs x86-64 Linux, not {sys.platform} {platform.machine()}"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX512":
        return None, f"needs AVX-512 (torch reports {capability})"
    if not _gnu_openmp_loaded():
        return None, "torch's OpenMP runtime is not GNU libgomp (a second thread pool would compete for the cores)"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (set CC, or install gcc)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
        key = hashlib.sha256("\0".join([*(p.read_text() for p in (*SOURCES, *HEADERS)), " ".join(FLAGS), cc, version,
                                        _cpu_signature()]).encode()).hexdigest()[:20]
        target = _cache_dir() / f"decode_gemm-{key}.so"
        if not target.exists():
            _compile(cc, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"build failed: {exc}"
    ptr, n = ctypes.c_void_p, ctypes.c_long
    lib.grpo_panel_pack.argtypes = [ptr, n, n, ptr]
    lib.grpo_panel_pack.restype = None
    lib.grpo_panel_matmul.argtypes = [ptr, n, n, ptr, n, ptr, ptr]
    lib.grpo_panel_matmul.restype = ctypes.c_int
    lib.grpo_panel_threads.restype = ctypes.c_int
    lib.grpo_grad_accumulate.argtypes = [ptr, ptr, ptr, n, n, n, ctypes.c_int]
    lib.grpo_grad_accumulate.restype = None
    for name, args in (("grpo_exp", [ptr, ptr, n]), ("grpo_swiglu_forward", [ptr, ptr, ptr, n]),
                       ("grpo_swiglu_backward", [ptr, ptr, ptr, ptr, ptr, n]),
                       ("grpo_log_softmax_rows", [ptr, n, n, ptr, ptr, ctypes.c_int]),
                       ("grpo_head_grad_rows", [ptr, n, n, ptr, ptr, ptr, ptr, ptr, ctypes.c_float]),
                       ("grpo_rms_norm_forward", [ptr, ptr, ptr, ptr, n, n, ctypes.c_float]),
                       ("grpo_rms_norm_backward", [ptr, ptr, ptr, ptr, ptr, ptr, n, n])):
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = None
    longs, f32 = ctypes.POINTER(n), ctypes.c_float
    lib.grpo_attention_forward.argtypes = [ptr, ptr, ptr, longs, longs, longs, longs, ptr, f32, ptr, ptr]
    lib.grpo_attention_backward.argtypes = [ptr, ptr, ptr, longs, longs, longs, longs, ptr, f32, ptr, ptr, ptr, ptr,
                                            ptr, ptr]
    lib.grpo_attention_forward.restype = lib.grpo_attention_backward.restype = ctypes.c_int
    return lib, None


def pack(weight: torch.Tensor) -> PanelWeight:
    """`weight` packed into panels of 16 output columns (a copy; no autograd).

    Shape: weight [N, K] float32 on the CPU -> PanelWeight (panels [ceil(N / 16), K, 16])
    """
    lib = library()
    if lib is None:
        raise RuntimeError(f"rollout.decode_kernel: native is not available here: {unavailable_reason()}")
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"native_gemm.pack: needs a 2-D float32 CPU weight, got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    w = weight.detach().contiguous()
    n, k = w.shape
    panels = torch.empty((n + LANES - 1) // LANES, k, LANES, dtype=torch.float32, device=w.device)
    lib.grpo_panel_pack(w.data_ptr(), n, k, panels.data_ptr())
    return PanelWeight(panels, w.shape)


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
    out = torch.empty(x2.shape[0], n, dtype=torch.float32, device=x2.device)  # [M, N]
    if x2.shape[0]:
        b = None if bias is None else bias.detach().to(torch.float32).contiguous()
        status = library().grpo_panel_matmul(x2.data_ptr(), x2.shape[0], k, weight.panels.data_ptr(), n,
                                             None if b is None else b.data_ptr(), out.data_ptr())
        if status:
            raise MemoryError(f"native_gemm.matmul: no memory for the {x2.shape[0]} x {k} input's transposed copy")
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
        library().grpo_grad_accumulate(target.data_ptr(), a.data_ptr(), b.data_ptr(), m, n, b.shape[1], overwrite)
    elif overwrite:
        target.zero_()
    return target
