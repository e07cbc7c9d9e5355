"""grpo.cpu.heap: glibc's mmap threshold, giving free heap pages back, and the update's gradient buffer on
transparent huge pages."""

import ctypes.util
from pathlib import Path

import pytest
import torch

from grpo.cpu import heap
from grpo.cpu.grad_in_place import gradient_buffer

GLIBC = "libc.so.6" in (ctypes.util.find_library("c") or "")


def test_mmap_threshold_is_left_alone_when_off_or_user_set(monkeypatch):
    from grpo.cpu.heap import set_mmap_threshold

    assert set_mmap_threshold(0) is False
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert set_mmap_threshold(1) is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    import ctypes.util
    if ctypes.util.find_library("c") and "libc.so.6" in (ctypes.util.find_library("c") or ""):
        assert set_mmap_threshold(1) is True                                  # glibc accepts it
        assert set_mmap_threshold(0.25) is True                               # 256 KiB
        assert set_mmap_threshold(1) is True                                  # the default before 2026-11-25


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_release_free_heap_returns_the_holes_freed_tensors_leave_in_the_heap():
    """Tensors of 96 KiB come from glibc's heap (under its 128 KiB starting mmap threshold); freeing every other one
    leaves ~40 MiB of free holes between live blocks, still resident, that glibc's own top-of-heap trimming cannot
    reach. release_free_heap (cpu.malloc_trim) gives their pages back."""
    import ctypes.util

    from grpo.cpu.heap import release_free_heap

    if "libc.so.6" not in (ctypes.util.find_library("c") or ""):
        pytest.skip("glibc only")
    blocks = [torch.ones(24 * 1024) for _ in range(840)]    # 96 KiB each, touched
    held = _resident()
    keep = blocks[1::2]                                     # every other block stays: the holes cannot coalesce
    del blocks
    freed = _resident()
    assert held - freed < 8 * 2 ** 20                      # the holes stay resident after the free
    assert release_free_heap() is True
    assert freed - _resident() > 30 * 2 ** 20              # ~40 MiB of holes given back
    assert len(keep) == 420 and float(keep[-1][0]) == 1.0


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "none"
    return text.split("[")[1].split("]")[0]


def _vm_flags(address: int) -> set[str]:
    """The kernel's flags on the mapping that holds `address` (/proc/self/smaps); "hg" is MADV_HUGEPAGE's mark."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_large_cpu_buffers_start_on_a_huge_page_boundary_zeroed(monkeypatch):
    """>= 8 MiB: the 2 MiB-aligned part of a one-page-larger allocation, zeroed; where the kernel's THP mode is madvise
    or always the kernel backs it with huge pages where it has them free (advice: whether it does is the kernel's
    call, so the test checks the advice is on the mapping). Small buffers, other devices and `cpu.huge_pages` off:
    torch.zeros."""
    monkeypatch.setitem(heap._huge_pages, "on", True)
    # 40 MiB: above glibc's largest mmap threshold (32 MiB), so fresh pages the advice reaches before the first touch
    # (a smaller block may come from heap pages already touched, which stay 4 KiB), as the update's buffer
    big = heap.zeros(10 * 2 ** 20, torch.float32, torch.device("cpu"))
    assert big.shape == (10 * 2 ** 20,) and big.dtype == torch.float32 and not big.any()
    assert big.data_ptr() % heap.HUGE_PAGE == 0
    assert big.untyped_storage().nbytes() == 40 * 2 ** 20 + heap.HUGE_PAGE
    if _thp_mode() in ("madvise", "always"):
        assert "hg" in _vm_flags(big.data_ptr())                              # MADV_HUGEPAGE is on its mapping
        assert "hg" in _vm_flags(big.data_ptr() + 40 * 2 ** 20 - 1)           # to its last aligned page
    small = heap.zeros(1000, torch.float64, torch.device("cpu"))
    assert small.untyped_storage().nbytes() == 8000 and not small.any()
    assert heap.zeros(3 * 2 ** 20, torch.float32, torch.device("meta")).device.type == "meta"
    heap.use_huge_pages(False)
    assert heap.zeros(5 * 2 ** 20, torch.float32, torch.device("cpu")).untyped_storage().nbytes() == 20 * 2 ** 20


def test_gradient_buffer_views_one_huge_page_buffer(monkeypatch):
    """cpu.grad_buffer on the CPU: every gradient a zeroed view of the one buffer (on huge pages where available)."""
    monkeypatch.setitem(heap._huge_pages, "on", True)
    params = [torch.nn.Parameter(torch.randn(1024, 1024)), torch.nn.Parameter(torch.randn(3000))]
    (flat,) = gradient_buffer(params)
    assert flat.numel() == 1024 * 1024 + 3000 and not flat.any()
    assert all(p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in params)
    params[1].grad += 1.0
    assert float(flat[-1]) == 1.0 and float(flat.sum()) == 3000.0
