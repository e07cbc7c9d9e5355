"""Tests for grpo.modeling.rollout_weights: the weights a rollout's decode steps use, fused and oneDNN-packed."""

import pytest
import torch
import transformers

from grpo.cpu import kernels as cpu_kernels, native_gemm
from grpo.modeling import rollout_weights
from grpo.cpu.kernels import linear
from grpo.modeling.rollout_weights import fuse_projections, packed_head
from grpo.cpu.hooks import CpuRolloutWeights

CPU = CpuRolloutWeights()          # the CPU runtime's rollout hook: packs for oneDNN or the native kernel
from tests.modeling.test_decoder import SHAPE, with_lora

pytestmark = pytest.mark.skipif(not cpu_kernels.onednn_works(), reason="this torch build has no oneDNN linear")


def float32_packed(w, rows: int) -> bool:
    """`w` is packed as a float32 rollout of `rows` rows packs: for the native decode kernel where it is active
    (`cpu.decode_kernel` auto, up to native_gemm.MAX_ROWS rows), else for oneDNN."""
    if native_gemm.active() and cpu_kernels.padded_rows(rows) <= native_gemm.MAX_ROWS:
        return type(w) is native_gemm.PanelWeight
    return w.is_mkldnn


def qwen2(dtype=torch.float32):
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE)).to(dtype).eval()


@pytest.mark.parametrize("pack_rows", [None, 6, 100])
@torch.no_grad()
def test_fused_and_packed_projections_equal_the_modules(pack_rows):
    """q/k/v and gate/up as one product each (split back), o and down: each equals its module's output, in
    float64, packed or not; packed weights are copies (native panels at 6 rows where that kernel runs, oneDNN's
    layout at 100), unpacked o and down the modules' own tensors."""
    model = qwen2()
    fused = fuse_projections(model.model.layers, None, pack_rows, CPU)
    x = torch.randn(5, SHAPE["hidden_size"], dtype=torch.float64)
    for layer, f in zip(model.model.layers, fused):
        attn, mlp = layer.self_attn, layer.mlp
        assert all(float32_packed(w, pack_rows) if pack_rows else not w.is_mkldnn for w in (f.qkv, f.gate_up, f.o, f.down))
        if pack_rows is None:
            assert f.o is attn.o_proj.weight and f.down is mlp.down_proj.weight
        q, k, v = linear(x.float(), f.qkv, f.qkv_bias).double().split(f.qkv_sizes, dim=-1)
        for got, mod in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj)):
            torch.testing.assert_close(got, x @ mod.weight.double().T + mod.bias.double(), atol=1e-5, rtol=1e-5)
        gate, up = linear(x.float(), f.gate_up).double().chunk(2, dim=-1)
        torch.testing.assert_close(gate, x @ mlp.gate_proj.weight.double().T, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(up, x @ mlp.up_proj.weight.double().T, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear(x.float(), f.o, f.o_bias).double(), x @ attn.o_proj.weight.double().T,
                                   atol=1e-5, rtol=1e-5)
        xi = torch.randn(5, SHAPE["intermediate_size"], dtype=torch.float64)
        torch.testing.assert_close(linear(xi.float(), f.down).double(), xi @ mlp.down_proj.weight.double().T,
                                   atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_size_cap_applies_only_without_packing(monkeypatch):
    """Above FUSE_MAX_BYTES unpacked copies are not made (they would only cost memory); packed ones always are
    (the packing is the point), so a large float32 model on the CPU still gets them."""
    model = qwen2()
    monkeypatch.setattr(rollout_weights, "FUSE_MAX_BYTES", 1024)
    assert fuse_projections(model.model.layers) is None
    assert fuse_projections(model.model.layers, None, 16, CPU) is not None


@torch.no_grad()
def test_bf16_weights_are_packed_only_where_asked_and_adapters_never():
    """The caller asks for packing (grpo.cpu.kernels.can_prepack: float32, or bf16 where oneDNN's bf16 is
    native): bf16 weights are then packed in bf16, float32 ones cast to autocast's dtype first; float16 weights never;
    LoRA projections are not fused at all; the head is packed only when it is a plain float32 / bf16 linear layer."""
    fp16 = qwen2(torch.float16)
    fused = fuse_projections(fp16.model.layers, None, 16, CPU)
    assert fused is not None and not any(f.qkv.is_mkldnn for f in fused) and fused[0].qkv.dtype == torch.float16
    assert packed_head(fp16.lm_head, 16, None, CPU) is None
    if cpu_kernels.bf16_native():
        for model, dtype in ((qwen2(torch.bfloat16), None), (qwen2(), torch.bfloat16)):
            fused = fuse_projections(model.model.layers, dtype, 16, CPU)
            assert all(w.is_mkldnn and w.dtype == torch.bfloat16 for f in fused for w in (f.qkv, f.gate_up, f.o, f.down))
            assert fused[0].qkv_bias.dtype == torch.bfloat16
            head = packed_head(model.lm_head, 16, dtype, CPU)
            assert head.is_mkldnn and head.dtype == torch.bfloat16
    lora = with_lora(qwen2())
    assert fuse_projections(lora.get_base_model().model.layers, None, 16, CPU) is None
    head = packed_head(qwen2().lm_head, 16, None, CPU)
    assert float32_packed(head, 16) and head.shape == (SHAPE["vocab_size"], SHAPE["hidden_size"])
    assert packed_head(qwen2().lm_head, None, None, CPU) is None


@pytest.mark.skipif(not cpu_kernels.bf16_native(), reason="oneDNN's bfloat16 GEMMs are emulated on this CPU")
@torch.no_grad()
def test_packed_bf16_products_equal_autocast_linear():
    """Under `train.precision` bf16 the rollout's packed bfloat16 copies give exactly autocast's F.linear: the
    input and bias cast to bfloat16, the product in bfloat16 (float32 input, as from the float32 attention)."""
    model = qwen2()
    f = fuse_projections(model.model.layers, torch.bfloat16, 5, CPU)[0]
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    x = torch.randn(5, SHAPE["hidden_size"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = linear(x, f.qkv, f.qkv_bias).split(f.qkv_sizes, dim=-1)
        for got, mod in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj)):
            assert got.dtype == torch.bfloat16 and torch.equal(got, mod(x))
        assert torch.equal(linear(x, f.o, f.o_bias), attn.o_proj(x))
        gate, up = linear(x.bfloat16(), f.gate_up).chunk(2, dim=-1)
        assert torch.equal(gate, mlp.gate_proj(x.bfloat16())) and torch.equal(up, mlp.up_proj(x.bfloat16()))
        head = packed_head(model.lm_head, 5, torch.bfloat16, CPU)
        assert torch.equal(linear(x, head, None), model.lm_head(x))
