"""grpo.cpu.native_attention: the short-sequence causal attention kernel (`cpu.attention_kernel`) against a
float64 scaled_dot_product_attention, inside a Hugging Face model (marked modules only), and where it steps aside."""

import copy

import pytest
import torch
import torch.nn.functional as F

from grpo.cpu import native_attention, native_gemm
from tests.conftest import tiny_qwen2

needs_kernel = pytest.mark.skipif(native_gemm.library() is None,
                                  reason=f"native kernels: {native_gemm.unavailable_reason()}")


def heads(B, Hq, Hk, T, D, seed=0):
    """q, k, v laid out as transformers' projections leave them: [B, T, H, D] memory seen as [B, H, T, D]."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, h, D, generator=g).transpose(1, 2) for h in (Hq, Hk, Hk)]


def padding_mask(B, T, pads):
    """transformers' boolean sdpa mask [B, 1, T, T] for left padding: causal and not a pad key."""
    keep = torch.ones(B, T, dtype=torch.bool)
    for row, n in enumerate(pads):
        keep[row, :n] = False
    return (torch.tril(torch.ones(T, T, dtype=torch.bool))[None] & keep[:, None, :])[:, None]


def reference(q, k, v, mask, scale, do):
    """float64 sdpa output [B, T, Hq, D] (rows with no allowed key: 0) and its gradients."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask, is_causal=mask is None, scale=scale,
                                         enable_gqa=True).transpose(1, 2)
    if mask is not None:
        out = torch.where(mask[:, 0].any(-1)[:, :, None, None], out, 0.0)
    grads = torch.autograd.grad(out, (q64, k64, v64), do.double())
    return out.detach(), [torch.nan_to_num(g) for g in grads]


@needs_kernel
@pytest.mark.parametrize("B,Hq,Hk,T,D,pads", [(4, 12, 4, 88, 64, None), (2, 4, 4, 17, 20, None),
                                              (3, 6, 2, 37, 8, (0, 5, 36)), (1, 2, 1, 1, 16, None),
                                              (2, 4, 2, 40, 32, (3, 0))])
def test_values_and_gradients_equal_float64_sdpa(B, Hq, Hk, T, D, pads):
    """Grouped-query heads, head sizes below, at and past one vector (8, 16, 20, 32, 64), causal or transformers'
    padding mask (a row whose keys are all padding gives 0), a length of 1."""
    q, k, v = heads(B, Hq, Hk, T, D)
    mask = None if pads is None else padding_mask(B, T, pads)
    do = torch.randn(B, T, Hq, D, generator=torch.Generator().manual_seed(1))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = native_attention.attention(*leaves, mask, D ** -0.5)
    grads = torch.autograd.grad(out, leaves, do)
    want, want_grads = reference(q, k, v, mask, D ** -0.5, do)
    assert out.shape == (B, T, Hq, D) and out.is_contiguous()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for got, exp in zip(grads, want_grads):
        torch.testing.assert_close(got.double(), exp, rtol=1e-5, atol=2e-5)
    if pads and max(pads) == T - 1:                          # a fully padded row before its last position
        assert not out[2, : T - 1].any()


@needs_kernel
def test_results_do_not_depend_on_the_thread_count():
    q, k, v = heads(3, 6, 2, 50, 64, seed=4)
    do = torch.randn(3, 50, 6, 64)
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = native_attention.attention(*leaves, None, 0.125)
            results.append([out, *torch.autograd.grad(out, leaves, do)])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def counted(monkeypatch):
    calls = []
    real = native_attention.attention
    monkeypatch.setattr(native_attention, "attention", lambda *a: calls.append(a[0].shape) or real(*a))
    return calls


@needs_kernel
def test_marked_models_train_the_same_through_the_kernel(monkeypatch):
    """A tiny Qwen2 (sdpa) with left-padded rows: logits and every gradient equal the unmarked model's; every
    attention call of the marked model went to the kernel, none of the other's."""
    calls = counted(monkeypatch)
    stock = tiny_qwen2().train()
    native = copy.deepcopy(stock)
    assert native_attention.use_native_attention(native) is True
    assert native.config._attn_implementation == native_attention.NAME == "grpo_native"
    assert stock.config._attn_implementation == "sdpa"                  # only the model switched: no global patch
    ids = torch.randint(2, 32, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    outs = []
    for model in (stock, native):
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float().square().mean().backward()
        outs.append(logits)
        assert len(calls) == (0 if model is stock else 2)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(stock.named_parameters(), native.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert native_attention.use_native_attention(native, False) is False
    native(input_ids=ids, attention_mask=mask)
    assert len(calls) == 2 and native.config._attn_implementation == "sdpa"


@needs_kernel
def test_calls_it_does_not_serve_go_to_sdpa(monkeypatch):
    """float64, more positions than MAX_POSITIONS, attention dropout, `cpu.attention_kernel` torch, a cache's
    decode step (one query, more keys): transformers' sdpa, with the same values."""
    calls = counted(monkeypatch)
    model = tiny_qwen2().train()
    native_attention.use_native_attention(model)
    ids = torch.randint(2, 32, (2, 9), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids)
    assert len(calls) == 2
    monkeypatch.setattr(native_attention, "MAX_POSITIONS", 8)
    model(input_ids=ids)
    monkeypatch.setattr(native_attention, "MAX_POSITIONS", 768)
    monkeypatch.setitem(native_gemm._modes, "attention", "torch")
    model(input_ids=ids)
    monkeypatch.setitem(native_gemm._modes, "attention", "auto")
    copy.deepcopy(model).double()(input_ids=ids)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    model(input_ids=ids)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.0
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        model(input_ids=ids[:, :1], cache=out.past_key_values, use_cache=True)
    assert len(calls) == 4                                     # the two plain calls and the prefill of the cache


def test_mode_is_checked(monkeypatch):
    monkeypatch.setattr(native_gemm, "_modes", dict(native_gemm._modes))
    with pytest.raises(ValueError, match=r"cpu.attention_kernel: 'flash' is not one of auto \| native \| torch"):
        native_gemm.configure(attention="flash")


def test_transformers_sdpa_entry_is_left_alone():
    """Registering grpo's attention adds a name; transformers' own "sdpa" entry stays its function (the whole process's
    other models are untouched), and a model loaded with eager attention is not switched."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = tiny_qwen2()
    native_attention.use_native_attention(model)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward
    assert ALL_ATTENTION_FUNCTIONS["grpo_native"] is native_attention.native_or_sdpa
    assert ALL_MASK_ATTENTION_FUNCTIONS["grpo_native"] is sdpa_mask          # the masks are sdpa's
    eager = tiny_qwen2()
    eager.set_attn_implementation("eager")
    assert native_attention.use_native_attention(eager) is False and eager.config._attn_implementation == "eager"
