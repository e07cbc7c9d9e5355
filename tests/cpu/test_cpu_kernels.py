"""grpo/cpu/kernels.py: oneDNN float32 linears equal the float64 formula, in values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from grpo.cpu import kernels
from grpo.cpu.kernels import DnnLinear, linear, onednn_works
from grpo.cpu.placement import should_switch, use_cpu_matmul

pytestmark = pytest.mark.skipif(not kernels.onednn_works(), reason="this torch build has no oneDNN linear")


def tensors(bias: bool = True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 24, generator=g, requires_grad=True)             # [..., K]
    w = torch.randn(16, 24, generator=g, requires_grad=True)                # [N, K]
    b = torch.randn(16, generator=g, requires_grad=True) if bias else None
    return x, w, b


@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_equal_float64(bias):
    x, w, b = tensors(bias)
    upstream = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    y = linear(x, w, b)
    (y * upstream).sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if bias else None
    y64 = x64 @ w64.T + (b64 if bias else 0)                                 # the formula, in float64
    (y64 * upstream.double()).sum().backward()
    assert y.shape == (3, 5, 16)
    assert torch.allclose(y.double(), y64, atol=1e-5)
    assert torch.allclose(x.grad.double(), x64.grad, atol=1e-5)              # dX = dY W
    assert torch.allclose(w.grad.double(), w64.grad, atol=1e-4)              # dW = dY^T X
    if bias:
        assert torch.allclose(b.grad.double(), b64.grad, atol=1e-5)          # db = sum dY


def test_padded_rows_bounds_shapes_and_waste():
    assert [kernels.padded_rows(m) for m in (1, 16, 17, 129, 256, 257, 1000, 1025, 5504)] == \
        [16, 16, 32, 144, 256, 288, 1024, 1152, 5632]
    for m in range(1, 5000):
        p = kernels.padded_rows(m)
        assert m <= p <= max(m + 15, m * 9 // 8 + 1)
    assert len({kernels.padded_rows(m) for m in range(1025, 2049)}) == 8        # 8 row counts per octave


@pytest.mark.parametrize("rows", [17, 300])
def test_padded_gemms_equal_float64_with_and_without_graph(rows):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 24, generator=g, requires_grad=True)              # rows not a multiple of 16
    w, b = torch.randn(16, 24, generator=g, requires_grad=True), torch.randn(16, generator=g)
    upstream = torch.randn(rows, 16, generator=g)
    y = linear(x, w, b)
    (y * upstream).sum().backward()
    x64, w64 = x.detach().double(), w.detach().double()
    with torch.no_grad():
        assert torch.allclose(linear(x, w, b).double(), x64 @ w64.T + b.double(), atol=1e-5)
    assert y.shape == (rows, 16) and torch.allclose(y.double(), x64 @ w64.T + b.double(), atol=1e-5)
    assert torch.allclose(x.grad.double(), upstream.double() @ w64, atol=1e-5)          # dX = dY W
    assert torch.allclose(w.grad.double(), upstream.double().T @ x64, atol=1e-4)        # dW = dY^T X


@pytest.mark.parametrize("mode,hint", [("onednn", 1), ("onednn", 16), ("onednn", 40), ("native", 1), ("native", 16),
                                       ("native", 40), ("native", 100)])
@torch.no_grad()
def test_prepacked_weight_gives_the_float64_product_for_any_row_count(mode, hint, monkeypatch):
    """A weight packed for `hint` rows (a rollout's) serves products of every row count (rows leave a rollout),
    through linear, with and without bias; it is a copy, not a view of the weight. `cpu.decode_kernel`
    native packs for grpo's own kernel up to native_gemm.MAX_ROWS rows, for oneDNN above."""
    from grpo.cpu import native_gemm

    if mode == "native" and native_gemm.library() is None:
        pytest.skip(f"native decode kernel: {native_gemm.unavailable_reason()}")
    monkeypatch.setitem(native_gemm._modes, "decode", mode)
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(48, 40, generator=g), torch.randn(48, generator=g)
    packed = kernels.prepack(w, hint)
    native = mode == "native" and hint <= native_gemm.MAX_ROWS
    assert (type(packed) is native_gemm.PanelWeight) == native and packed.is_mkldnn != native
    assert packed.shape == w.shape
    for rows in (1, 5, 16, 33, 70):
        x = torch.randn(rows, 40, generator=g)
        expect = x.double() @ w.double().T                                   # [rows, N] the formula in float64
        assert torch.allclose(linear(x, packed).double(), expect, atol=1e-4)
        assert torch.allclose(linear(x[None], packed, b)[0].double(), expect + b.double(), atol=1e-4)
    w.add_(1.0)                                                              # the packed copy keeps the old values
    assert torch.allclose(linear(x, packed).double(), expect, atol=1e-4)


def test_prepacking_applies_to_float32_and_native_bf16_on_the_cpu_only(monkeypatch):
    assert kernels.can_prepack(torch.device("cpu"), torch.float32)
    assert not kernels.can_prepack(torch.device("cpu"), torch.float16)
    for native in (True, False):                     # bf16 only where oneDNN's bf16 GEMMs are not emulated
        monkeypatch.setattr(kernels, "bf16_native", lambda native=native: native)
        assert kernels.can_prepack(torch.device("cpu"), torch.bfloat16) is native
    assert not kernels.can_prepack(torch.device("cuda", 0), torch.float32)
    assert not kernels.can_prepack(torch.device("meta"), torch.float32)


def test_frozen_weight_gets_no_gradient():
    x, w, b = tensors()
    w.requires_grad_(False)
    linear(x, w, b).sum().backward()
    assert w.grad is None and x.grad is not None and b.grad is not None


def test_ineligible_inputs_take_f_linear_exactly():
    x, w, b = (t.detach().double() for t in tensors())
    assert torch.equal(linear(x, w, b), F.linear(x, w, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_takes_f_linear_so_the_product_is_cast(dtype):
    """Under CPU autocast (train.precision bf16 / fp16) oneDNN's float32 call would bypass the cast:
    linear() must give exactly autocast's F.linear, with float32 gradients for the float32 weights."""
    x, w, b = tensors()
    with torch.autocast("cpu", dtype=dtype):
        y = linear(x, w, b)
        expected = F.linear(x, w, b)
    assert y.dtype is dtype and torch.equal(y, expected)
    assert (y.float() - F.linear(x, w, b)).abs().max() > 0                   # not the float32 product
    y.float().sum().backward()
    assert w.grad.dtype is torch.float32 and x.grad.dtype is torch.float32
    assert torch.allclose(w.grad, torch.ones(3 * 5, 16).T @ x.detach().reshape(-1, 24), rtol=2e-2, atol=2e-2)


def test_switching_a_model_keeps_its_outputs_and_training_step():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    plain = Qwen2ForCausalLM(cfg)
    fast = copy.deepcopy(plain)
    n = use_cpu_matmul(fast, "onednn")
    assert n == 2 * 7 + 1                                                    # q k v o gate up down per layer + head
    assert all(type(m) is DnnLinear for m in fast.modules() if isinstance(m, torch.nn.Linear))
    assert fast.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(0, 50, (2, 9))
    for model in (plain, fast):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        model.logits = out.logits
    assert torch.allclose(plain.logits, fast.logits, atol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name                        # same SGD step
    assert use_cpu_matmul(fast, "aten") == 0                                 # and back
    assert not any(type(m) is DnnLinear for m in fast.modules())


def test_modes():
    assert should_switch("onednn") and not should_switch("aten")
    assert isinstance(should_switch("auto"), bool)
    assert not should_switch("auto", width=128)                              # narrow models stay on aten
    with pytest.raises(ValueError, match="cpu.cpu_matmul"):
        should_switch("mkl")
def test_mmap_threshold_takes_fractions_of_a_mib():
    from grpo.config import ConfigError, build_config

    assert build_config(overrides={"cpu.mmap_threshold_mb": "0.25"}).cpu.mmap_threshold_mb == 0.25
    assert build_config().cpu.mmap_threshold_mb == 0.0                  # glibc's own threshold by default
    with pytest.raises(ConfigError, match="cpu.mmap_threshold_mb"):
        build_config(overrides={"cpu.mmap_threshold_mb": -0.5})


# --- cpu.grad_in_place: weight gradients accumulated into .grad by one GEMM --------------------------------

def grads_of(model, batches, checkpointing: bool = False, chunked: bool = False) -> dict[str, torch.Tensor]:
    """The accumulated gradients of one backward pass per batch (micro-batches of one step)."""
    from grpo.modeling.logprobs import completion_logprobs
    from grpo.training.update import set_gradient_checkpointing

    set_gradient_checkpointing(model, checkpointing)
    model.train()
    for ids in batches:
        if chunked:   # the trainer's path: backbone, then the LM head in checkpointed chunks
            out = completion_logprobs(model, ids, torch.ones_like(ids), 4, chunk_size=3)
            loss = out[0].sum()
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing,chunked,lean,tied", [
    (False, False, False, True), (True, False, False, True), (False, True, False, True), (True, True, True, True),
    (False, False, True, False), (False, True, False, False)])
def test_in_place_weight_gradients_equal_autograds(checkpointing, chunked, lean, tied):
    """GradIntoLinear / GradIntoEmbedding over two micro-batches == stock autograd (float64, 1e-12), tied or
    separate LM head and embedding (whose padding row gets no gradient), under activation checkpointing, the
    chunked checkpointed LM head and the lean SwiGLU MLP."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo.cpu.grad_in_place import GradIntoEmbedding, GradIntoLinear
    from grpo.modeling.lean_layers import use_lean_layers

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, pad_token_id=0,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    plain = Qwen2ForCausalLM(cfg).double()
    into = copy.deepcopy(plain)
    assert use_cpu_matmul(into, "aten", grad_in_place=True) == 0
    assert sum(type(m) is GradIntoLinear for m in into.modules()) == 2 * 7 + 1
    assert type(into.model.embed_tokens) is GradIntoEmbedding and into.model.embed_tokens.padding_idx == 0
    if lean:
        use_lean_layers(plain), use_lean_layers(into)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 40, (2, 9), generator=g), torch.randint(0, 40, (3, 7), generator=g)]
    batches[0][:, :2] = 0                                                    # padding tokens in the input
    expect = grads_of(plain, batches, checkpointing, chunked)
    got = grads_of(into, batches, checkpointing, chunked)
    assert expect.keys() == got.keys()
    if not tied:                                                             # the padding row: no gradient
        assert not got["model.embed_tokens.weight"][0].any()
    for name in expect:
        assert expect[name].abs().max() > 0, name
        torch.testing.assert_close(got[name], expect[name], atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.skipif(not onednn_works(), reason="this torch build has no working oneDNN linear")
@pytest.mark.parametrize("tied,chunked", [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("kernel", ["onednn", "native"])
def test_onednn_in_place_gradients_equal_autograds(monkeypatch, tied, chunked, kernel):
    """float32 DnnLinear with `cpu.grad_in_place`: dW (oneDNN: the first micro-batch's product becomes .grad, the
    second's is added in vocabulary/row blocks; native, `cpu.grad_kernel`: both added in place into a zeroed .grad;
    both through add_product_) and db go into .grad over two micro-batches; equal to the same model through autograd
    (1e-5) and to float64 autograd to float32 rounding, for a tied or separate LM head, the trainer's chunked (fused)
    head or the model's loss."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo.cpu import kernels as cpu_kernels, native_gemm

    if kernel == "native" and native_gemm.library() is None:
        pytest.skip(f"native kernel: {native_gemm.unavailable_reason()}")
    monkeypatch.setitem(native_gemm._modes, "grad", kernel)
    monkeypatch.setattr(cpu_kernels, "BLOCK_BYTES", 32 * 4 * 64)          # 64-row blocks: several per weight
    blocks = []
    real = cpu_kernels.add_product_
    monkeypatch.setattr(cpu_kernels, "add_product_", lambda t, a, b, *rows: blocks.append(t.shape) or real(t, a, b, *rows))
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=200, hidden_size=32, intermediate_size=96, num_hidden_layers=2, pad_token_id=0,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    ref64 = Qwen2ForCausalLM(cfg).double()
    models = {into: copy.deepcopy(ref64).float() for into in (True, False)}
    for into, model in models.items():
        assert use_cpu_matmul(model, "onednn", grad_in_place=into) == 2 * 7 + 1
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 200, (2, 9), generator=g), torch.randint(0, 200, (3, 7), generator=g)]
    got = grads_of(models[True], batches, chunked=chunked)
    # the first micro-batch's dW becomes .grad; the second's is added in blocks: 2 layers x 7 projections
    assert len(blocks) >= 2 * 7 and {(96, 32), (32, 96), (32, 32)} <= set(blocks)
    blocks.clear()
    autograd = grads_of(models[False], batches, chunked=chunked)
    # without into: autograd's dW; only the fused head (chunked) adds its dW into autograd's tensor in blocks
    assert {tuple(shape) for shape in blocks} <= ({(200, 32)} if chunked else set())
    expect = grads_of(ref64, batches, chunked=chunked)
    for name in expect:
        assert expect[name].abs().max() > 0, name
        torch.testing.assert_close(got[name], autograd[name], atol=1e-5, rtol=1e-5, msg=name)
        torch.testing.assert_close(got[name].double(), expect[name], atol=1e-4, rtol=1e-4, msg=name)


def test_in_place_linear_falls_back_where_it_must():
    """Frozen weights, no autograd, autocast and a mismatched input dtype take F.linear (no .grad written)."""
    from grpo.cpu.grad_in_place import GradIntoLinear

    layer = torch.nn.Linear(6, 5)
    layer.__class__ = GradIntoLinear
    x = torch.randn(4, 6)
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).grad_fn.name() != "_GradIntoLinearFnBackward"
    y = layer(x)
    assert y.grad_fn.name() == "_GradIntoLinearFnBackward"
    y.sum().backward()
    torch.testing.assert_close(layer.weight.grad, torch.ones(4, 5).t() @ x)     # dW = dY^T X
    torch.testing.assert_close(layer.bias.grad, torch.full((5,), 4.0))          # db = sum dY
    layer.requires_grad_(False)
    assert layer(x.requires_grad_()).grad_fn.name() != "_GradIntoLinearFnBackward"


@pytest.mark.parametrize("world,setting,expected", [("1", True, "GradIntoLinear"), ("2", True, "Linear"),
                                                     ("1", False, "Linear")])
def test_cpu_runtime_accumulates_in_place_in_one_process_only(monkeypatch, world, setting, expected):
    """cpu.grad_in_place applies in a single CPU process: under torchrun DDP / FSDP reduce gradients from the
    hooks it skips, so the linears stay plain there."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo.config import build_config
    from grpo.training.runtime import CpuRuntime

    monkeypatch.setenv("WORLD_SIZE", world)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))
    cfg = build_config(overrides={"cpu.cpu_matmul": "aten", "cpu.grad_in_place": setting})
    CpuRuntime(torch.device("cpu"), cfg).place(model)
    assert {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)} == {expected}


def test_in_place_embedding_gradient_is_reproducible_and_exact_at_two_threads():
    """GradIntoEmbedding's index_add_ of many repeated rows: bitwise the same over repeats at 2 threads
    (docs/reliability.md, determinism), and equal to the float64 sum of each row's gradients."""
    from grpo.cpu.grad_in_place import GradIntoEmbedding

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(4)
        emb = torch.nn.Embedding(50, 16)
        emb.__class__ = GradIntoEmbedding
        ids, up = torch.randint(0, 8, (32, 40), generator=g), torch.randn(32, 40, 16, generator=g)
        grads = []
        for _ in range(3):
            emb.weight.grad = None
            emb(ids).backward(up)
            grads.append(emb.weight.grad.clone())
        assert all(torch.equal(grads[0], x) for x in grads[1:])
        expect = torch.zeros(50, 16, dtype=torch.float64).index_add_(0, ids.reshape(-1), up.reshape(-1, 16).double())
        torch.testing.assert_close(grads[0].double(), expect, atol=1e-4, rtol=1e-5)
    finally:
        torch.set_num_threads(threads)


def test_pad_rows_reuses_one_zero_padded_workspace_per_slot(monkeypatch):
    """pad_rows: x with zero rows appended, in a per-slot workspace reused across calls (stale rows re-zeroed);
    an exact fit is x itself; an operand over PAD_WORKSPACE_BYTES gets a new tensor."""
    from grpo.cpu import kernels as cpu_kernels

    a = cpu_kernels.pad_rows(torch.full((3, 4), 7.0), 16)
    assert a.shape == (16, 4) and (a[:3] == 7).all() and not a[3:].any()
    ptr = a.data_ptr()
    b = cpu_kernels.pad_rows(torch.full((2, 4), 5.0), 16)                 # same slot: same memory, rows 2-3 zeroed
    assert b.data_ptr() == ptr and (b[:2] == 5).all() and not b[2:].any()
    g = cpu_kernels.pad_rows(torch.ones(2, 4), 16, "g")                   # another slot: its own memory
    assert g.data_ptr() != ptr and (b[:2] == 5).all()
    x = torch.randn(16, 4)
    assert cpu_kernels.pad_rows(x, 16) is x
    monkeypatch.setattr(cpu_kernels, "PAD_WORKSPACE_BYTES", 64)
    big = cpu_kernels.pad_rows(torch.ones(3, 4), 16)
    assert big.data_ptr() != ptr and big[:3].all() and not big[3:].any()


def test_onednn_check_is_not_fooled_by_autocast():
    """onednn_works() is cached for the process; first asked under bf16 autocast (a bf16 rollout's can_prepack),
    it must still compare float32 products, not autocast's bfloat16 F.linear (which once cached False)."""
    kernels.onednn_works.cache_clear()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert kernels.onednn_works()
        assert kernels.onednn_works()
    finally:
        kernels.onednn_works.cache_clear()
