"""grpo.cpu.native_gemm: the rollout's own decode-step GEMM (`cpu.decode_kernel`)."""

import re

import pytest
import torch

from grpo.cpu import native_gemm, native_library

needs_kernel = pytest.mark.skipif(native_gemm.library() is None,
                                  reason=f"native decode kernel: {native_gemm.unavailable_reason()}")


@needs_kernel
@pytest.mark.parametrize("rows,n,k", [(16, 1280, 768), (1, 16, 8), (7, 60, 128), (17, 33, 5), (64, 100, 20),
                                      (3, 5, 1)])
@torch.no_grad()
def test_panel_product_equals_the_float64_formula(rows, n, k):
    """y = x W^T + b for any row count (tiles of 16 rows and a partial one) and any width (a partial last panel)."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    packed = native_gemm.pack(w)
    assert packed.shape == (n, k) and packed.panels.shape == ((n + 15) // 16, k, 16)
    expect = x.double() @ w.double().T                                     # [rows, n]
    tol = 1e-6 * k ** 0.5 * 10
    torch.testing.assert_close(native_gemm.matmul(x, packed).double(), expect, atol=tol, rtol=1e-5)
    torch.testing.assert_close(native_gemm.matmul(x, packed, b).double(), expect + b.double(), atol=tol, rtol=1e-5)


@needs_kernel
@torch.no_grad()
def test_panels_hold_the_weight_columns_zero_padded():
    """panels[p, i, j] = W[16 p + j, i], zero past the last column: a copy (later changes to W do not reach it)."""
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    packed = native_gemm.pack(w)
    assert torch.equal(packed.panels[0], w[:16].T)
    assert torch.equal(packed.panels[1, :, :4], w[16:].T) and not packed.panels[1, :, 4:].any()
    w.zero_()
    assert packed.panels[0, 0, 1] == 3.0


@needs_kernel
@torch.no_grad()
def test_leading_dimensions_and_empty_inputs():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(24, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    packed = native_gemm.pack(w)
    out = native_gemm.matmul(x, packed)
    assert out.shape == (2, 3, 24)
    torch.testing.assert_close(out, x @ w.T, atol=1e-5, rtol=1e-5)
    assert native_gemm.matmul(x[:, :0], packed).shape == (2, 0, 24)
    with pytest.raises(ValueError, match="x has 7 features, the weight 8"):
        native_gemm.matmul(torch.randn(2, 7), packed)


@needs_kernel
@torch.no_grad()
def test_results_do_not_depend_on_the_thread_count():
    """Each output column is one thread's, summed in k order: 1 and 2 threads give the same bits."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(512, 256, generator=g), torch.randn(16, 256, generator=g)
    packed, threads = native_gemm.pack(w), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert native_gemm.library().grpo_panel_threads() == 1             # torch's thread pool is the kernel's
        one = native_gemm.matmul(x, packed)
        torch.set_num_threads(2)
        assert native_gemm.library().grpo_panel_threads() == 2
        two = native_gemm.matmul(x, packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_kernel
def test_no_autograd():
    packed = native_gemm.pack(torch.randn(16, 4))
    with pytest.raises(RuntimeError, match="without autograd"):
        native_gemm.matmul(torch.randn(2, 4, requires_grad=True), packed)


def test_modes_and_reasons(monkeypatch):
    """auto uses the kernel only where it runs; native where it cannot is an error naming why; bad modes fail."""
    monkeypatch.setattr(native_gemm, "_modes", dict(native_gemm._modes))
    with pytest.raises(ValueError, match=re.escape("cpu.decode_kernel: 'fast' is not one of auto | native | onednn")):
        native_gemm.configure("fast")
    with pytest.raises(ValueError, match=re.escape("cpu.grad_kernel: 'fast' is not one of")):
        native_gemm.configure(grad="fast")
    monkeypatch.setattr(native_library, "_load", lambda: (None, "needs AVX-512 (torch reports AVX2)"))
    native_gemm.configure("auto", "auto")
    assert not native_gemm.active("grad") and not native_gemm.active() and native_gemm.unavailable_reason() == "needs AVX-512 (torch reports AVX2)"
    with pytest.raises(RuntimeError, match=r"native is not available here: needs AVX-512 \(torch reports AVX2\)"):
        native_gemm.configure("native")
    with pytest.raises(RuntimeError, match=r"cpu.grad_kernel: native is not available here"):
        native_gemm.configure(grad="native")
    from grpo.cpu import kernels as cpu_kernels

    assert cpu_kernels.prepack(torch.randn(32, 16), 16).is_mkldnn             # auto without the kernel: oneDNN


def test_build_conditions_and_a_failing_compiler(monkeypatch, tmp_path):
    """The build's own checks: the CPU, the compiler (a failing one gives the reason, not an exception), the cache."""
    load = native_library._load.__wrapped__
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert load() == (None, "needs AVX-512 (torch reports AVX2)")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(native_library, "_gnu_openmp_loaded", lambda: True)
    monkeypatch.setenv("GRPO_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    lib, reason = load()
    assert lib is None and reason.startswith("build failed: false failed on") and not list(tmp_path.iterdir())


@needs_kernel
def test_builds_into_the_cache_directory(monkeypatch, tmp_path):
    """A fresh cache directory gets one library (compiled once, then reused by the next load)."""
    monkeypatch.setenv("GRPO_KERNEL_CACHE", str(tmp_path))
    load = native_library._load.__wrapped__
    lib, reason = load()
    assert reason is None and lib is not None
    built = list(tmp_path.iterdir())
    assert len(built) == 1 and built[0].name.startswith("decode_gemm-") and built[0].suffix == ".so"
    mtime = built[0].stat().st_mtime_ns
    assert load()[0] is not None and built[0].stat().st_mtime_ns == mtime


@needs_kernel
@pytest.mark.parametrize("rows,n,k", [(401, 100, 64), (7, 15, 40), (1, 1, 1), (64, 5000, 32), (33, 29, 70)])
@torch.no_grad()
def test_grad_accumulate_adds_the_float64_product(rows, n, k):
    """target += a^T b for any shape: tiles of 14 target rows and a partial one, 32-column panels and a tail of
    plain loops (k = 40, 70, 1), a's columns in several L2 blocks (64 x 5000 floats > 1 MiB)."""
    g = torch.Generator().manual_seed(rows + n + k)
    a, b, target = torch.randn(rows, n, generator=g), torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    expect = target.double() + a.double().T @ b.double()                   # [n, k]
    out = native_gemm.grad_accumulate(target, a, b)
    assert out is target
    torch.testing.assert_close(target.double(), expect, atol=1e-6 * rows ** 0.5 * 10, rtol=1e-5)


@needs_kernel
@torch.no_grad()
def test_grad_accumulate_is_thread_count_independent_and_checks_its_operands():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(100, 300, generator=g), torch.randn(100, 96, generator=g)
    results, threads = [], torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            results.append(native_gemm.grad_accumulate(torch.zeros(300, 96), a, b))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])
    with pytest.raises(ValueError, match=r"target \(300, 95\) != a\^T b of a \(100, 300\), b \(100, 96\)"):
        native_gemm.grad_accumulate(torch.zeros(300, 95), a, b)
    with pytest.raises(ValueError, match="contiguous float32 CPU"):
        native_gemm.grad_accumulate(torch.zeros(96, 300).t(), a, b)


@needs_kernel
@pytest.mark.parametrize("rows,n,k", [(33, 29, 70), (64, 5000, 32), (0, 3, 4)])
@torch.no_grad()
def test_grad_accumulate_overwrite_stores_what_adding_to_zeros_gives(rows, n, k):
    """`overwrite`: target = a^T b, bit for bit the sums added to a zeroed target, whatever the target held (NaN
    here: never read), in the tiles and in the plain-loop tail; no rows: zeros."""
    g = torch.Generator().manual_seed(rows + n)
    a, b = torch.randn(rows, n, generator=g), torch.randn(rows, k, generator=g)
    added = native_gemm.grad_accumulate(torch.zeros(n, k), a, b)
    stored = native_gemm.grad_accumulate(torch.full((n, k), float("nan")), a, b, overwrite=True)
    assert torch.equal(stored, added) and (rows or not stored.any())
