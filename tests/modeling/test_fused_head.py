"""The one-buffer LM head (grpo.modeling.fused_head) against a float64 log-softmax of the full logits: log-probs,
entropies and every gradient (hidden states, weight, bias), with temperature, entropy gradients, chunks that do
not divide the tokens, in-place weight gradients and tied weights; and where it applies."""

import pytest
import torch

from grpo.cpu import kernels as cpu_kernels, workspace
from grpo.modeling import fused_head
from grpo.cpu.kernels import DnnLinear, onednn_works
from grpo.cpu.grad_in_place import GradIntoLinear
from grpo.modeling.logprobs import chunked_head


def reference(hidden, weight, bias, tokens, tau):
    """The formula on float64 full logits: logp_y = z_y - lse(z), H = -sum p log p, z = (h W^T + b) / tau."""
    z = hidden @ weight.t() + (bias if bias is not None else 0)
    if tau > 0 and tau != 1.0:
        z = z / tau
    logp = torch.log_softmax(z, dim=-1)
    return logp.gather(1, tokens[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)


def leaves(M=37, H=8, V=29, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(M, H, generator=g, dtype=torch.float64)
    w = torch.randn(V, H, generator=g, dtype=torch.float64)
    b = torch.randn(V, generator=g, dtype=torch.float64) if bias else None
    tokens = torch.randint(0, V, (M,), generator=g)
    g_logp, g_ent = torch.randn(M, generator=g, dtype=torch.float64), torch.randn(M, generator=g, dtype=torch.float64)
    return h, w, b, tokens, g_logp, g_ent


@pytest.mark.parametrize("tau,bias,entropy_grad,chunk", [(1.0, True, True, 5), (0.7, False, True, 37),
                                                         (1.3, True, False, 8), (1.0, False, False, 64)])
def test_values_and_gradients_equal_the_float64_formula(tau, bias, entropy_grad, chunk):
    h, w, b, tokens, g_logp, g_ent = leaves(bias=bias)
    head = torch.nn.Linear(8, 29, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(w)
        if bias:
            head.bias.copy_(b)
    x = h.clone().requires_grad_(True)
    logp, ent = fused_head.head_logprobs(head, x, tokens, tau, True, chunk)
    (logp * g_logp + (ent * g_ent if entropy_grad else 0)).sum().backward()

    x64, w64 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    b64 = b.clone().requires_grad_(True) if bias else None
    want_logp, want_ent = reference(x64, w64, b64, tokens, tau)
    (want_logp * g_logp + (want_ent * g_ent if entropy_grad else 0)).sum().backward()
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=1e-12)
    torch.testing.assert_close(x.grad, x64.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, w64.grad, rtol=0, atol=1e-12)
    if bias:
        torch.testing.assert_close(head.bias.grad, b64.grad, rtol=0, atol=1e-12)
    assert x.grad.abs().max() > 0.1 and head.weight.grad.abs().max() > 0.1


@pytest.mark.parametrize("chunk,recomputed", [(37, 0), (64, 0), (8, 4)])
def test_backward_reuses_the_last_chunks_log_probs_the_buffer_still_holds(monkeypatch, chunk, recomputed):
    """With the entropy (the update's call), the forward leaves log p of its last chunk in the buffer and the
    backward starts from it: the logits are recomputed for the other chunks only (37 tokens in chunks of 8: 4 of
    5). If something wrote into the buffer in between (another forward here), the backward recomputes every chunk,
    and the gradients are the float64 formula's either way."""
    h, w, b, tokens, g_logp, _ = leaves(bias=True)
    head = torch.nn.Linear(8, 29, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.copy_(b)
    calls = []
    real = fused_head._Products.logits_into
    monkeypatch.setattr(fused_head._Products, "logits_into", lambda *a: calls.append(1) or real(*a))
    w64, b64 = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    want, _ = reference(h, w64, b64, tokens, 0.9)
    (want * g_logp).sum().backward()
    chunks = -(-37 // chunk)
    for overwritten in (False, True):
        head.zero_grad(set_to_none=True)
        logp, _ = fused_head.head_logprobs(head, h, tokens, 0.9, True, chunk)
        if overwritten:
            with torch.no_grad():
                fused_head.head_logprobs(head, h.flip(0), tokens, 0.9, True, chunk)
        calls.clear()
        (logp * g_logp).sum().backward()
        assert len(calls) == (chunks if overwritten else recomputed)
        torch.testing.assert_close(head.weight.grad, w64.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(head.bias.grad, b64.grad, rtol=0, atol=1e-12)


def test_in_place_weight_gradients_accumulate_into_grad_over_two_passes():
    """A GradIntoLinear head: dW is added into .grad (autograd gets None), twice = the float64 sum of both."""
    h, w, b, tokens, g_logp, _ = leaves(bias=True)
    head = GradIntoLinear(8, 29, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.copy_(b)
    for half in (slice(0, 20), slice(20, 37)):
        logp, _ = fused_head.head_logprobs(head, h[half].clone().requires_grad_(True), tokens[half], 0.9, False, 6)
        (logp * g_logp[half]).sum().backward()
    w64, b64 = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    want, _ = reference(h, w64, b64, tokens, 0.9)
    (want * g_logp).sum().backward()
    torch.testing.assert_close(head.weight.grad, w64.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.bias.grad, b64.grad, rtol=0, atol=1e-12)


def test_tied_head_and_embedding_sum_both_gradients():
    """A head that shares its weight with the embedding: the weight's gradient is the sum of both uses."""
    g = torch.Generator().manual_seed(3)
    emb = torch.nn.Embedding(29, 8, dtype=torch.float64)
    head = torch.nn.Linear(8, 29, bias=False, dtype=torch.float64)
    head.weight = emb.weight
    ids, tokens = torch.randint(0, 29, (11,), generator=g), torch.randint(0, 29, (11,), generator=g)
    logp, _ = fused_head.head_logprobs(head, torch.tanh(emb(ids)), tokens, 1.0, False, 4)
    logp.sum().backward()
    got = emb.weight.grad.clone()
    emb.weight.grad = None
    want, _ = reference(torch.tanh(emb(ids)), emb.weight, None, tokens, 1.0)
    want.sum().backward()
    torch.testing.assert_close(got, emb.weight.grad, rtol=0, atol=1e-12)


def test_chunked_head_takes_the_fused_path_and_agrees_with_the_checkpointed_chunks(monkeypatch):
    """grpo.modeling.logprobs.chunked_head: the same values and gradients through the fused head as through the
    checkpointed per-chunk path (float32, the trainer's dtype), with and without autograd."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False)
    h = torch.randn(50, 16)
    tokens = torch.randint(0, 300, (50,))
    runs = []
    for fused in (True, False):
        monkeypatch.setattr(fused_head, "applies", lambda *a, _f=fused: _f)
        head.zero_grad(set_to_none=True)
        x = h.clone().requires_grad_(True)
        logp, ent = chunked_head(head, x, tokens, 0.8, True, 16)
        (logp.sum() + 0.1 * ent.sum()).backward()
        with torch.no_grad():
            nograd = chunked_head(head, h, tokens, 0.8, True, 16)
        runs.append((logp.detach(), ent.detach(), x.grad, head.weight.grad, *nograd))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_where_it_applies():
    h = torch.randn(4, 8)
    assert fused_head.applies(torch.nn.Linear(8, 10), h)
    assert fused_head.applies(GradIntoLinear(8, 10), h)
    assert not fused_head.applies(torch.nn.Linear(8, 10).double(), h)            # dtype differs from the hidden states
    assert not fused_head.applies(torch.nn.Linear(8, 10).bfloat16(), h.bfloat16())
    hooked = torch.nn.Linear(8, 10)
    hooked.register_forward_hook(lambda *a: None)
    assert not fused_head.applies(hooked, h)                                      # a hook must see the call

    class Wrapped(torch.nn.Linear):                                               # a subclass (LoRA) keeps
        pass                                                                      # its own forward
    assert not fused_head.applies(Wrapped(8, 10), h)
    dnn = torch.nn.Linear(8, 10)
    dnn.__class__ = DnnLinear
    assert fused_head.applies(dnn, h)                                             # float32 oneDNN: oneDNN products
    assert (fused_head.fast_gemm(dnn, h) is not None) == onednn_works()           # the class's own GEMMs (hooks)
    assert fused_head.fast_gemm(torch.nn.Linear(8, 10), h) is None
    assert fused_head.fast_gemm(DnnLinear(8, 10).double(), h.double()) is None    # float64: torch.mm's products
    with torch.autocast("cpu", dtype=torch.bfloat16):                             # bf16 autocast: products in bf16
        assert fused_head.applies(torch.nn.Linear(8, 10), h) and fused_head.applies(dnn, h)
        assert fused_head.applies(torch.nn.Linear(8, 10).bfloat16(), h)          # a reference's stored bf16 head
        assert not fused_head.applies(torch.nn.Linear(8, 10), h.double()) and not fused_head.applies(Wrapped(8, 10), h)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not fused_head.applies(torch.nn.Linear(8, 10), h)


def test_no_tokens_gives_empty_outputs_that_keep_the_graph():
    head = torch.nn.Linear(8, 10)
    x = torch.randn(0, 8, requires_grad=True)
    logp, ent = fused_head.head_logprobs(head, x, torch.zeros(0, dtype=torch.long), 1.0, True, 256)
    assert logp.shape == ent.shape == (0,) and logp.requires_grad
    logp.sum().backward()
    assert x.grad.shape == (0, 8) and torch.equal(head.weight.grad, torch.zeros(10, 8))


@pytest.mark.parametrize("kind,into", [("linear", False), ("dnn", False), ("dnn", True), ("dnn-cast", True)])
def test_bf16_autocast_equals_autocasts_checkpointed_chunks(monkeypatch, kind, into):
    """Under CPU bf16 autocast the fused head runs its products in bfloat16 as autocast does (logits rounded to
    bf16, dL/dlogits rounded to bf16 for dL/dh and dL/dW): log-probs, entropies, dL/dh and the float32 weight
    gradient (autograd's, or added into .grad in place; the update's one cast weight, or a cast here) equal the
    checkpointed chunks under autocast to float32 rounding (far closer than float32's own values); dW (computed
    in vocabulary blocks) to bf16 rounding and closer to float32's than autocast's, whose cached cast sums the
    chunks' dW in bf16."""
    torch.manual_seed(0)
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", 128)                      # dW in 4 vocabulary blocks, the last short
    head = torch.nn.Linear(32, 500, bias=False)
    if kind != "linear":
        head.__class__ = DnnLinear
        head.grad_into = into
    if kind == "dnn-cast":
        head.cast_weight = head.weight.detach().bfloat16()
    h = torch.randn(40, 32)
    tokens = torch.randint(0, 500, (40,))
    runs = {}
    for fused in (True, False, "fp32"):
        monkeypatch.setattr(fused_head, "applies", lambda *a, _f=fused: _f is True)
        head.zero_grad(set_to_none=True)
        x = h.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fused != "fp32"):
            if kind == "dnn" and fused is False:                              # autocast's own F.linear
                head.__class__ = torch.nn.Linear
            logp, ent = chunked_head(head, x, tokens, 0.9, True, 16)
            with torch.no_grad():
                nograd = chunked_head(head, h, tokens, 0.9, True, 16)
            if kind != "linear":
                head.__class__ = DnnLinear
        (logp.sum() + 0.1 * ent.sum()).backward()
        runs[fused] = (logp.detach(), ent.detach(), x.grad, head.weight.grad, *nograd)
    assert runs[True][3].dtype == torch.float32
    for name, got, autocast_, fp32 in zip(("logp", "entropy", "dh", "dW", "logp no grad", "entropy no grad"),
                                          runs[True], runs[False], runs["fp32"]):
        if name == "dW":   # each chunk's bf16 dW summed in float32 here; autocast's cached cast sums them in bf16
            assert (got - autocast_).abs().max() <= 1e-2 * autocast_.abs().max(), name
            assert (got - fp32).norm() <= (autocast_ - fp32).norm(), name
            continue
        assert (got - autocast_).abs().max() <= 1e-5 * autocast_.abs().max() + 1e-6, name
        assert (fp32 - autocast_).abs().max() > 10 * (got - autocast_).abs().max(), name


@pytest.mark.skipif(not onednn_works(), reason="this torch build has no working oneDNN linear")
@pytest.mark.parametrize("bias,into,entropy_grad,tau", [(True, False, True, 0.8), (False, True, False, 1.0),
                                                        (True, True, True, 1.0)])
def test_float32_onednn_head_equals_the_float64_formula(monkeypatch, bias, into, entropy_grad, tau):
    """A float32 DnnLinear head (`cpu.cpu_matmul`) keeps its products in oneDNN: logits in vocabulary-column blocks
    copied into the buffer, dL/dW in vocabulary-row blocks added in place (into autograd's dW or .grad), rows padded
    to a multiple of 16 (37 tokens: 11 zero rows; chunk 20 -> 16). Values and gradients equal the float64 formula
    to float32 rounding, and every product was a oneDNN call."""
    monkeypatch.setattr(cpu_kernels, "BLOCK_BYTES", 16 * 4 * 64)    # 64-column / 64-row blocks: 4 of them, last short
    calls = []
    real = cpu_kernels.OneDnnGemm.mm
    monkeypatch.setattr(cpu_kernels.OneDnnGemm, "mm", staticmethod(lambda *a: calls.append(a[0].shape) or real(*a)))
    h, w, b, tokens, g_logp, g_ent = leaves(M=37, H=8, V=200, bias=bias)
    head = torch.nn.Linear(8, 200, bias=bias)
    with torch.no_grad():
        head.weight.copy_(w)
        if bias:
            head.bias.copy_(b)
    head.__class__, head.grad_into = DnnLinear, into
    for _ in range(2):                                                 # twice: dW accumulates over passes
        x = h.float().requires_grad_(True)
        logp, ent = fused_head.head_logprobs(head, x, tokens, tau, True, 20)
        (logp * g_logp.float() + (ent * g_ent.float() if entropy_grad else 0)).sum().backward()
    assert logp.shape == ent.shape == (37,) and x.grad.shape == (37, 8)
    assert calls and all(shape[0] % 16 == 0 for shape in calls[:3])   # forward: 16-row chunks, padded
    with torch.no_grad():
        nograd = fused_head.head_logprobs(head, h.float(), tokens, tau, True, 20)
    x64, w64 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    b64 = b.clone().requires_grad_(True) if bias else None
    want_logp, want_ent = reference(x64, w64, b64, tokens, tau)
    (want_logp * g_logp + (want_ent * g_ent if entropy_grad else 0)).sum().backward()
    for got, want in ((logp, want_logp), (ent, want_ent), (nograd[0], want_logp), (nograd[1], want_ent),
                      (x.grad, x64.grad), (head.weight.grad, 2 * w64.grad)) + (((head.bias.grad, 2 * b64.grad),)
                                                                                if bias else ()):
        torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
    assert head.weight.grad.abs().max() > 0.1


def test_logsumexp_in_place_equals_torchs_and_buffers_are_reused_until_released():
    """_logsumexp gives torch.logsumexp's values bit for bit (in a scratch buffer, or destroying z), infinite maxima
    included; the head's CPU buffers are the same memory from call to call until workspace.release."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, 301, generator=g) * 5
    z[3] = float("-inf")
    z[4, 2] = float("inf")
    want = torch.logsumexp(z, dim=-1)
    torch.testing.assert_close(fused_head._logsumexp(z.clone(), torch.empty_like(z)), want, rtol=0, atol=0,
                               equal_nan=True)
    torch.testing.assert_close(fused_head._logsumexp(z.clone(), None), want, rtol=0, atol=0, equal_nan=True)
    head, h = torch.nn.Linear(8, 50), torch.randn(20, 8)
    workspace.release()
    first = fused_head.head_logprobs(head, h, torch.zeros(20, dtype=torch.long), 1.0, True, 16)
    ptr = workspace.held("head.logits", h, (16, 50)).data_ptr()
    again = fused_head.head_logprobs(head, h[:5], torch.zeros(5, dtype=torch.long), 1.0, True, 16)
    assert workspace.held("head.logits", h, (5, 50)).data_ptr() == ptr and torch.equal(again[0], first[0][:5])
    workspace.release()
    assert not workspace.held_names()
