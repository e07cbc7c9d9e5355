"""grpo.cpu.native_elementwise: the update's fused elementwise passes (`cpu.elementwise_kernel`) against
float64 formulas, their in-place contracts, their checks, and the layers that call them against torch's path."""

import pytest
import torch

from grpo.cpu import native_elementwise, native_gemm
from grpo.modeling import fused_head
from grpo.modeling.lean_layers import SwiGLUFn

needs_kernel = pytest.mark.skipif(native_gemm.library() is None,
                                  reason=f"native kernels: {native_gemm.unavailable_reason()}")
EPS = torch.finfo(torch.float32).eps


@needs_kernel
def test_exp_is_within_two_ulp_and_keeps_the_special_values():
    x = torch.cat([torch.linspace(-103.0, 88.7, 200_001), torch.linspace(-1, 1, 4097)])
    got, want = native_elementwise.exp(x).double(), torch.exp(x.double())
    normal = want > torch.finfo(torch.float32).tiny                       # below: flushed or denormal, both tiny
    assert ((got - want).abs() / want)[normal].max() <= 2 * EPS
    assert (got[~normal] <= 2 * torch.finfo(torch.float32).tiny).all()
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, 89.0, -110.0, 1000.0])
    out = native_elementwise.exp(special)
    assert out[0] == float("inf") and out[1] == 0 and out[2].isnan() and out[3] == 1
    assert out[4] == float("inf") and out[5] == 0 and out[6] == float("inf")


def swiglu_64(g, u, ga):
    """a = silu(g) u and, for dL/da = ga, dg and du, in float64 by autograd."""
    g64, u64 = g.double().requires_grad_(), u.double().requires_grad_()
    a = torch.nn.functional.silu(g64) * u64
    dg, du = torch.autograd.grad(a, (g64, u64), ga.double())
    return a.detach(), dg, du


@needs_kernel
@pytest.mark.parametrize("shape", [(7, 37), (352, 2048), (1, 5)])
def test_swiglu_passes_equal_the_float64_formula(shape):
    """Any length (vector tails, several parallel chunks); the backward writes dg over its ga argument."""
    gen = torch.Generator().manual_seed(shape[1])
    g, u, ga = (3 * torch.randn(shape, generator=gen) for _ in range(3))
    g[0, 0], g[-1, -1] = -120.0, 95.0                                     # sigmoid saturated both ways
    a64, dg64, du64 = swiglu_64(g, u, ga)
    torch.testing.assert_close(native_elementwise.swiglu_forward(g, u).double(), a64, rtol=4 * EPS, atol=1e-6)
    ga_in = ga.clone()
    dg, du, a = native_elementwise.swiglu_backward_(g, u, ga_in)
    assert dg is ga_in
    for got, want in ((dg, dg64), (du, du64), (a, a64)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def head_64(z, tokens):
    """lse, entropy (0 log 0 = 0) and log p of logits rows in float64."""
    z = z.double()
    logp = torch.log_softmax(z, -1)
    return torch.logsumexp(z, -1), -torch.special.xlogy(logp.exp(), logp.exp()).sum(-1), logp


@needs_kernel
@pytest.mark.parametrize("v", [37, 4096])
def test_log_softmax_rows_equal_the_float64_formula(v):
    gen = torch.Generator().manual_seed(v)
    z = 4 * torch.randn(9, v, generator=gen)
    z[1, : v // 2] = -float("inf")                                        # masked logits: p = 0, no NaN
    z[2] += 1000.0                                                        # large logits: shifted by the maximum
    lse64, ent64, logp64 = head_64(z, None)
    lse, ent = torch.empty(9), torch.empty(9)
    kept = z.clone()
    native_elementwise.log_softmax_rows_(kept, lse, None, logp=False)
    assert torch.equal(kept, z)                                           # without log p, z is left alone
    torch.testing.assert_close(lse.double(), lse64, rtol=2e-6, atol=2e-6)
    native_elementwise.log_softmax_rows_(kept, lse, ent, logp=True)
    torch.testing.assert_close(lse.double(), lse64, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ent.double(), ent64, rtol=1e-5, atol=1e-5)
    finite = logp64.isfinite()
    torch.testing.assert_close(kept.double()[finite], logp64[finite], rtol=1e-5, atol=1e-4)
    assert (kept[~finite] == -float("inf")).all()


@needs_kernel
@pytest.mark.parametrize("entropy,shift,tau", [(True, False, 1.0), (False, True, 0.7), (True, True, 0.0)])
def test_head_gradient_rows_equal_the_float64_formula(entropy, shift, tau):
    """dL/dz of L = sum g_y logp_y + g_H H over rows of log p (or of logits with their lse), / tau."""
    gen = torch.Generator().manual_seed(int(entropy) + 2 * int(shift))
    n, v = 6, 53
    z = 3 * torch.randn(n, v, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, v, (n,), generator=gen)
    g_logp, g_ent = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    z64 = z.clone().requires_grad_()
    lse64, ent64, logp64 = head_64(z64, tokens)
    loss = (logp64.gather(1, tokens[:, None]).squeeze(1) * g_logp.double()).sum()
    if entropy:
        loss = loss + (ent64 * g_ent.double()).sum()
    (want,) = torch.autograd.grad(loss, z64)
    if tau > 0 and tau != 1.0:
        want = want / tau
    dz = (z if shift else logp64.detach()).float().contiguous()
    native_elementwise.head_grad_rows_(dz, lse64.detach().float() if shift else None, g_logp,
                                       g_ent if entropy else None, ent64.detach().float(), tokens, tau)
    torch.testing.assert_close(dz.double(), want, rtol=1e-5, atol=2e-6)


@needs_kernel
def test_checks_name_the_function_and_the_fault():
    x = torch.ones(4, 8)
    with pytest.raises(ValueError, match="swiglu_forward: needs contiguous float32"):
        native_elementwise.swiglu_forward(x.double(), x.double())
    with pytest.raises(ValueError, match="swiglu_backward_: shapes differ"):
        native_elementwise.swiglu_backward_(x, x, torch.ones(4, 9))
    with pytest.raises(IndexError, match=r"outside the vocabulary \[0, 8\)"):
        native_elementwise.head_grad_rows_(x.clone(), None, torch.ones(4), None, None, torch.tensor([0, 1, 8, 2]), 1.0)
    with pytest.raises(ValueError, match="lse"):
        native_elementwise.log_softmax_rows_(x.clone(), torch.empty(3), None, False)


def test_applies_only_to_float32_contiguous_cpu_tensors_in_its_mode(monkeypatch):
    x = torch.ones(4, 8)
    built = native_gemm.library() is not None
    monkeypatch.setitem(native_gemm._modes, "elementwise", "auto")
    assert native_elementwise.applies(x, None) == built == native_elementwise.applies(torch.nn.Parameter(x))
    assert not native_elementwise.applies(x, x.double()) and not native_elementwise.applies(x.t())
    monkeypatch.setitem(native_gemm._modes, "elementwise", "torch")
    assert not native_elementwise.applies(x)
    with pytest.raises(ValueError, match="cpu.elementwise_kernel: 'onednn' is not one of auto | native | torch"):
        native_gemm.configure(elementwise="onednn")


@needs_kernel
@pytest.mark.parametrize("mode", ["auto", "torch"])
def test_swiglu_layer_is_the_same_through_either_path(monkeypatch, mode):
    """SwiGLUFn (float32, plain products) through the native passes and through torch's operators: both equal the
    float64 formula to float32 rounding; the native passes are counted."""
    monkeypatch.setitem(native_gemm._modes, "elementwise", mode)
    calls = []
    for name in ("swiglu_forward", "swiglu_backward_"):
        real = getattr(native_elementwise, name)
        monkeypatch.setattr(native_elementwise, name, lambda *a, _r=real: calls.append(1) or _r(*a))
    gen = torch.Generator().manual_seed(3)
    leaves = [torch.randn(*s, generator=gen).requires_grad_() for s in ((9, 16), (40, 16), (40, 16), (16, 40))]
    gy = torch.randn(9, 16, generator=gen)
    grads = torch.autograd.grad(SwiGLUFn.apply(*leaves, None), leaves, gy)
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    y64 = (torch.nn.functional.silu(l64[0] @ l64[1].T) * (l64[0] @ l64[2].T)) @ l64[3].T
    for got, want in zip(grads, torch.autograd.grad(y64, l64, gy.double())):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert len(calls) == (2 if mode == "auto" else 0)


@needs_kernel
@pytest.mark.parametrize("mode", ["auto", "torch"])
@pytest.mark.parametrize("chunk", [8, 37])
def test_float32_head_is_the_same_through_either_path(monkeypatch, mode, chunk):
    """The fused head in float32 (chunks recomputed in the backward, or the kept last chunk) with the entropy's
    gradient and a temperature, through the native row passes and through torch's: both equal float64."""
    monkeypatch.setitem(native_gemm._modes, "elementwise", mode)
    gen = torch.Generator().manual_seed(chunk)
    M, H, V = 37, 8, 45
    h, w = torch.randn(M, H, generator=gen), torch.randn(V, H, generator=gen)
    tokens = torch.randint(0, V, (M,), generator=gen)
    g_logp, g_ent = torch.randn(M, generator=gen), torch.randn(M, generator=gen)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(w)
    x = h.clone().requires_grad_()
    logp, ent = fused_head.head_logprobs(head, x, tokens, 0.8, True, chunk)
    (logp * g_logp + ent * g_ent).sum().backward()
    x64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    lp64 = torch.log_softmax(x64 @ w64.T / 0.8, -1)
    want_logp, want_ent = lp64.gather(1, tokens[:, None]).squeeze(1), -(lp64.exp() * lp64).sum(-1)
    (want_logp * g_logp.double() + want_ent * g_ent.double()).sum().backward()
    for got, want in ((logp, want_logp), (ent, want_ent), (x.grad, x64.grad), (head.weight.grad, w64.grad)):
        torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_results_do_not_depend_on_the_thread_count():
    gen = torch.Generator().manual_seed(5)
    g, u, ga = (torch.randn(300, 700, generator=gen) for _ in range(3))
    z = torch.randn(40, 3000, generator=gen)
    x, gy, w = torch.randn(300, 200, generator=gen), torch.randn(300, 200, generator=gen), torch.randn(200, generator=gen)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            lse, ent, zz = torch.empty(40), torch.empty(40), z.clone()
            native_elementwise.log_softmax_rows_(zz, lse, ent, True)
            y, r = native_elementwise.rms_norm_forward(x, w, 1e-6)
            outs.append([*native_elementwise.swiglu_backward_(g, u, ga.clone()), lse, ent, zz, y, r,
                         *native_elementwise.rms_norm_backward(gy, x, w, r, True, True)])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*outs))
