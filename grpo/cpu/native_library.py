"""The build of grpo's native CPU library (grpo/cpu/csrc: decode_gemm.c, elementwise.c, attention.c) and its
loading through ctypes, once per process, on first use (never at import).

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
