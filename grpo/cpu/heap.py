"""The CPU runtime's host-memory settings (glibc and Linux only; elsewhere nothing is done): glibc's mmap threshold
(`cpu.mmap_threshold_mb`), giving free heap pages back (`cpu.malloc_trim`), and the update's flat gradient
buffer (`cpu.grad_buffer`) on transparent huge pages (`cpu.huge_pages`).

The buffer: 100.7M float32 gradients are 400 MB, made (and zeroed) once per update and given back to the OS after the
step; in 4 KiB pages that is ~98 k page faults per update, which took 70-88 ms to zero-fill on the 2-core AMD EPYC
(Zen 5) VM against 14-19 ms in 2 MiB pages (229 faults). The first huge-page buffer of a process took 469 ms there
(the VM backing never-touched memory with 2 MiB pages; paid once), the next ones reused the same pages.
"""

from __future__ import annotations

import functools
import sys

import torch

#: Transparent huge page size (x86-64 and arm64 with 4 KiB base pages).
HUGE_PAGE = 2 << 20
#: Buffers below this many bytes stay in the ordinary allocation.
HUGE_MIN_BYTES = 8 << 20
MADV_HUGEPAGE = 14

_huge_pages = {"on": True}


def configure(mmap_threshold_mb: float, huge_pages: bool) -> None:
    """The CPU runtime's process set-up: `cpu.mmap_threshold_mb` (:func:`set_mmap_threshold`) and `cpu.huge_pages`
    (:func:`use_huge_pages`)."""
    set_mmap_threshold(mmap_threshold_mb)
    use_huge_pages(huge_pages)


def use_huge_pages(enabled: bool) -> None:
    """`cpu.huge_pages`: whether :func:`zeros` advises large CPU buffers as transparent huge pages (process-wide)."""
    _huge_pages["on"] = bool(enabled)


def zeros(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed flat buffer of `numel` values. On the CPU under Linux with glibc, at >= HUGE_MIN_BYTES and
    `cpu.huge_pages`, it is the 2 MiB-aligned part of a slightly larger allocation (one more huge page), advised
    ``MADV_HUGEPAGE`` before anything touches it, so the zero fill faults in 2 MiB pages (where the kernel's THP mode
    is madvise or always; a no-op where it is never). Same values, same resident size. Shape: [numel]"""
    itemsize = dtype.itemsize
    libc = _glibc()
    if (torch.device(device).type != "cpu" or not _huge_pages["on"] or not sys.platform.startswith("linux")
            or libc is None or numel * itemsize < HUGE_MIN_BYTES):
        return torch.zeros(numel, dtype=dtype, device=device)
    raw = torch.empty(numel + HUGE_PAGE // itemsize, dtype=dtype, device=device)
    start = -(-raw.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    flat = raw[(start - raw.data_ptr()) // itemsize:][:numel]
    libc.madvise(start, numel * itemsize // HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE)   # advice: failure is harmless
    return flat.zero_()


def set_mmap_threshold(megabytes: float) -> bool:
    """glibc only: serve host allocations of >= `megabytes` MiB by mmap (`cpu.mmap_threshold_mb`; fractions
    allowed, 0.25 = 256 KiB). Off by default (0).

    glibc's own threshold starts at 128 KiB and rises to the size of the largest freed mmapped block (at most
    32 MiB), so after the first step most activations come from its heap and freed ones stay resident for reuse.
    A fixed threshold instead returns each freed tensor of that size to the OS at once, and every new one is
    fresh pages from the kernel, zero-filled on first touch. On the earliest trainer (before in-place gradients
    and kept workspaces) glibc's own threshold let a 100M step's peak RSS grow by 450 MiB over three steps, and
    1 MiB was the default. Measured again on 2026-11-25 (AVX-512 host, bench/grid.py shapes, docs/performance.md):
    about the same peak (-76 to +55 MiB over 3-12 steps; +281 MiB with 1036-token micro-batches) and steps 2-3
    5-20 % faster without it (fresh pages are slow to fault in on a VM), so 0 became the default. 0, a non-glibc libc, or a user-set MALLOC_MMAP_THRESHOLD_ leave the
    allocator alone. Returns True when the threshold was set.
    """
    import os

    if megabytes <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(-3, int(megabytes * 2 ** 20)))   # M_MMAP_THRESHOLD = -3


def release_free_heap() -> bool:
    """glibc only: give the pages of the heap's free chunks back to the OS (``malloc_trim(0)``), so memory that
    freed tensors left as holes inside the heap stops counting in the resident set (`cpu.malloc_trim`). The next
    allocations there fault fresh zero pages in again. Returns False on a non-glibc libc (nothing done)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


@functools.lru_cache(maxsize=None)
def _glibc():
    """The process's glibc (ctypes), or None on another libc: the allocator calls above."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    if not all(hasattr(libc, name) for name in ("mallopt", "malloc_trim", "madvise")):
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc
