"""Tests for grpo.modeling.rollout_weights: the weights a rollout's decode steps use, fused and oneDNN-packed."""

import pytest
import torch
import transformers

from grpo.modeling import cpu_kernels, rollout_weights
from grpo.modeling.cpu_kernels import linear
from grpo.modeling.rollout_weights import fuse_projections, packed_head
from tests.modeling.test_decoder import SHAPE, with_lora

pytestmark = pytest.mark.skipif(not cpu_kernels.onednn_works(), reason="this torch build has no oneDNN linear")


def qwen2(dtype=torch.float32):
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE)).to(dtype).eval()


@pytest.mark.parametrize("pack_rows", [None, 6])
@torch.no_grad()
def test_fused_and_packed_projections_equal_the_modules(pack_rows):
    """q/k/v and gate/up as one product each (split back), o and down: each equals its module's output, in
    float64, packed or not; packed weights are oneDNN copies, unpacked o and down the modules' own tensors."""
    model = qwen2()
    fused = fuse_projections(model.model.layers, None, pack_rows)
    x = torch.randn(5, SHAPE["hidden_size"], dtype=torch.float64)
    for layer, f in zip(model.model.layers, fused):
        attn, mlp = layer.self_attn, layer.mlp
        assert all(w.is_mkldnn == (pack_rows is not None) for w in (f.qkv, f.gate_up, f.o, f.down))
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
    assert fuse_projections(model.model.layers, None, 16) is not None


@torch.no_grad()
def test_non_float32_weights_and_adapters_are_not_packed():
    """bfloat16 weights keep plain fused copies (oneDNN's bfloat16 packing needs AVX-512 or AVX-NE-CONVERT); LoRA
    projections are not fused at all; the head is packed only when it is a plain float32 linear layer."""
    bf16 = qwen2(torch.bfloat16)
    fused = fuse_projections(bf16.model.layers, None, 16)
    assert fused is not None and not any(f.qkv.is_mkldnn for f in fused) and fused[0].qkv.dtype == torch.bfloat16
    assert packed_head(bf16.lm_head, 16) is None
    lora = with_lora(qwen2())
    assert fuse_projections(lora.get_base_model().model.layers, None, 16) is None
    head = packed_head(qwen2().lm_head, 16)
    assert head.is_mkldnn and head.shape == (SHAPE["vocab_size"], SHAPE["hidden_size"])
    assert packed_head(qwen2().lm_head, None) is None
