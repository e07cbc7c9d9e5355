"""Lean RMSNorm and SwiGLU layers: the stock values and gradients, fewer saved activations, stock fallbacks."""

import copy

import pytest
import torch

from grpo.cpu.kernels import onednn_works
from grpo.cpu.placement import use_cpu_matmul
from grpo.modeling.lean_layers import RMSNormFn, SwiGLUFn, lean_mlps, use_lean_layers
from tests.conftest import tiny_qwen2


def rms_norm_64(x, w, eps):
    """The RMSNorm formula in float64. Shape: x [..., H], w [H] -> [..., H]"""
    x, w = x.double(), w.double()
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("mode,h", [("auto", 16), ("auto", 100), ("torch", 16)])
def test_rms_norm_matches_float64_formula_and_its_gradients(monkeypatch, mode, h):
    """Through grpo's native passes (`cpu.elementwise_kernel` auto, where built; 100 features: vector tails and a
    partial column block) or torch's operators."""
    from grpo.cpu import native_gemm

    monkeypatch.setitem(native_gemm._modes, "elementwise", mode)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, h, generator=g).requires_grad_()
    w = (1 + 0.1 * torch.randn(h, generator=g)).requires_grad_()
    gy = torch.randn(3, 5, h, generator=g)
    y = RMSNormFn.apply(x, w, 1e-6)
    gx, gw = torch.autograd.grad(y, (x, w), gy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = rms_norm_64(x64, w64, 1e-6)
    gx64, gw64 = torch.autograd.grad(y64, (x64, w64), gy.double())
    torch.testing.assert_close(y.double(), y64, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gx.double(), gx64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw.double(), gw64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("onednn", [False, True])
def test_swiglu_matches_the_stock_formula(onednn):
    if onednn and not onednn_works():
        pytest.skip("oneDNN matmul not available")
    dtype = torch.float32 if onednn else torch.float64      # oneDNN's path is float32 only
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 8, generator=g, dtype=dtype).requires_grad_()
    wg, wu = (torch.randn(12, 8, generator=g, dtype=dtype).requires_grad_() for _ in range(2))
    wd = torch.randn(8, 12, generator=g, dtype=dtype).requires_grad_()
    gy = torch.randn(7, 8, generator=g, dtype=dtype)
    from grpo.cpu.kernels import DnnLinear

    y = SwiGLUFn.apply(x, wg, wu, wd, DnnLinear.gemm if onednn else None)   # the class's GEMMs, or torch's
    grads = torch.autograd.grad(y, (x, wg, wu, wd), gy)
    leaves = [t.detach().double().requires_grad_() for t in (x, wg, wu, wd)]
    x64, wg64, wu64, wd64 = leaves
    y64 = (torch.nn.functional.silu(x64 @ wg64.T) * (x64 @ wu64.T)) @ wd64.T
    grads64 = torch.autograd.grad(y64, leaves, gy.double())
    tol = dict(rtol=1e-5, atol=1e-5) if onednn else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y.double(), y64, **tol)
    for a, b in zip(grads, grads64):
        torch.testing.assert_close(a.double(), b, **tol)


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    loss = (logits.log_softmax(-1)[..., 3] * torch.arange(ids.shape[1])).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("matmul", ["aten", "onednn"])
def test_switched_model_trains_like_the_stock_one(matmul):
    if matmul == "onednn" and not onednn_works():
        pytest.skip("oneDNN matmul not available")
    stock = tiny_qwen2().train()
    lean = copy.deepcopy(stock)
    assert use_lean_layers(lean) == 2 * 2 + 1 + 2          # 2 norms per layer, the final norm, 2 MLPs
    assert lean_mlps(lean) == 2
    use_cpu_matmul(stock, matmul), use_cpu_matmul(lean, matmul)
    ids = torch.randint(2, 32, (3, 10), generator=torch.Generator().manual_seed(0))
    loss, grads = loss_and_grads(stock, ids)
    loss_lean, grads_lean = loss_and_grads(lean, ids)
    torch.testing.assert_close(loss_lean, loss, rtol=1e-5, atol=1e-5)
    for name, g in grads.items():
        torch.testing.assert_close(grads_lean[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert use_lean_layers(lean, enabled=False) == 7 and lean_mlps(lean) == 0
    assert not any("forward" in vars(m) for m in lean.modules())


@pytest.mark.parametrize("in_place,kernel", [(True, "onednn"), (True, "native"), (False, "onednn")])
def test_onednn_mlp_weight_gradients_go_into_grad_in_place_over_micro_batches(in_place, kernel, monkeypatch):
    """cpu.grad_in_place with oneDNN projections: the lean MLP's weight gradients become / are added to .grad
    directly (autograd receives None for them), over two accumulated micro-batches, equal to the stock model's;
    by oneDNN's products or by the native kernel (`cpu.grad_kernel`, which writes them in place: counted)."""
    from grpo.cpu import native_gemm

    if not onednn_works():
        pytest.skip("oneDNN matmul not available")
    if kernel == "native" and native_gemm.library() is None:
        pytest.skip(f"native kernel: {native_gemm.unavailable_reason()}")
    monkeypatch.setitem(native_gemm._modes, "grad", kernel)
    native_calls = []
    real_accumulate = native_gemm.grad_accumulate
    monkeypatch.setattr(native_gemm, "grad_accumulate", lambda *a, **k: native_calls.append(1) or real_accumulate(*a, **k))
    stock = tiny_qwen2().train()
    lean = copy.deepcopy(stock)
    use_lean_layers(lean)
    use_cpu_matmul(stock, "onednn"), use_cpu_matmul(lean, "onednn", grad_in_place=in_place)
    returned = []
    backward = SwiGLUFn.backward

    def spy(ctx, gy):
        out = backward(ctx, gy)
        returned.append([g is None for g in out[1:4]])                  # the three weight gradients to autograd
        return out

    monkeypatch.setattr(SwiGLUFn, "backward", staticmethod(spy))
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(2, 32, (3, 10), generator=gen), torch.randint(2, 32, (2, 7), generator=gen)]
    for model in (stock, lean):
        for ids in batches:                                   # two micro-batches: made, then added to
            model(input_ids=ids).logits.float().square().mean().backward()
    for (name, p), q in zip(stock.named_parameters(), lean.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert returned == [[in_place] * 3] * 4                   # 2 layers x 2 micro-batches
    # native: 3 MLP weights + q/k/v/o (DnnLinear, add_product_) per layer and micro-batch, + the LM head per micro-batch
    assert len(native_calls) == ((3 + 4) * 4 + 2 if kernel == "native" else 0)


def saved_bytes(model, ids) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves for the backward pass of one forward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids).logits.sum()
    return sum(seen.values())


def test_lean_layers_save_the_derived_number_of_fewer_activations():
    stock = tiny_qwen2().train()
    lean = copy.deepcopy(stock)
    use_lean_layers(lean)
    ids = torch.randint(2, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    c = stock.config
    tokens, H, I, L = ids.numel(), c.hidden_size, c.intermediate_size, c.num_hidden_layers
    # per token: every norm drops its normed output (H; 2 per layer + the final one), every MLP drops
    # silu(g) and silu(g) * u (2 I)
    fewer = tokens * 4 * (L * (2 * H + 2 * I) + H)
    assert saved_bytes(stock, ids) - saved_bytes(lean, ids) == fewer


def test_stock_forward_without_autograd_under_autocast_and_with_lora():
    from grpo.config import build_config
    from grpo.modeling.lora import apply_lora

    model = tiny_qwen2()
    use_lean_layers(model)
    ids = torch.randint(2, 32, (2, 6), generator=torch.Generator().manual_seed(0))
    calls = []
    original = RMSNormFn.forward

    def counting(ctx, *a):
        calls.append(1)
        return original(ctx, *a)

    RMSNormFn.forward = staticmethod(counting)
    try:
        with torch.no_grad():
            model(input_ids=ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids)
        assert calls == []                                     # neither records a graph through the lean functions
        model(input_ids=ids)
        assert len(calls) == 5
    finally:
        RMSNormFn.forward = staticmethod(original)
    lora = apply_lora(tiny_qwen2(), build_config(overrides={"lora.enabled": True, "lora.r": 2,
                                                            "lora.target_modules": ["gate_proj", "up_proj"]}).lora)
    assert use_lean_layers(lora) == 5 and lean_mlps(lora) == 0  # adapters on the MLP: its stock forward


def test_deepcopy_binds_the_lean_forward_to_the_copy():
    model = tiny_qwen2()
    use_lean_layers(model)
    ref = copy.deepcopy(model)
    assert ref.model.layers[0].mlp.forward.__self__ is ref.model.layers[0].mlp
    assert lean_mlps(ref) == 2


@pytest.mark.skipif(not onednn_works(), reason="no oneDNN in this torch build")
def test_auto_turns_lean_layers_on_only_where_the_mlps_run_through_onednn():
    from grpo.cpu.placement import onednn_mlps, resolve_lean_layers

    model = tiny_qwen2().float()
    assert not onednn_mlps(model)
    assert resolve_lean_layers(None, model) is False                        # aten products: off
    assert resolve_lean_layers(True, model) is True and resolve_lean_layers(False, model) is False
    use_cpu_matmul(model, "onednn")                                         # every linear a DnnLinear
    assert onednn_mlps(model)
    assert resolve_lean_layers(None, model) is True                         # auto: on in one process
    assert resolve_lean_layers(None, model, world_size=2) is False          # torchrun: off
    assert resolve_lean_layers(False, model) is False                       # an explicit false wins


def test_train_resolves_lean_layers_after_placing_the_model(monkeypatch):
    """The CPU runtime decides `train.lean_layers` auto once cpu.cpu_matmul has switched the linears."""
    from grpo.api.inputs import resolve_model
    from grpo.config import build_config
    from grpo.training.runtime import build_runtime

    seen = {}
    import grpo.cpu.placement as lean

    real = lean.resolve_lean_layers

    def spy(setting, model, world_size=1):
        seen["linears"] = {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)}
        return real(setting, model, world_size)

    monkeypatch.setattr(lean, "resolve_lean_layers", spy)
    cfg = build_config(overrides={"cpu.cpu_matmul": "onednn" if onednn_works() else "aten"})
    model, _ = resolve_model(None, None, cfg, build_runtime(cfg))          # the embedded model
    expected = "DnnLinear" if onednn_works() else "GradIntoLinear"
    assert expected in seen["linears"]
    assert (lean_mlps(model) > 0) == onednn_works()
