"""The weights a rollout's decode steps multiply by, prepared once per rollout (grpo.modeling.decoder).

Two preparations, both copies made before the first decode step and freed with the rollout's cache:

- **fusion**: q/k/v and gate/up concatenated, one GEMM each instead of three and two. It saves per-call
  overhead, which matters for small matrices (embedded model: -0.4 ms of a 4 ms decode step).
- **packing** by the runtime's rollout hook (grpo.modeling.hooks.RolloutWeights; the CPU runtime's packs for oneDNN
  or grpo's native decode kernel, CPU float32, or bfloat16 under `train.precision` bf16 where oneDNN has native bf16
  kernels: grpo.cpu.kernels.prepack): every projection and the LM head in oneDNN's blocked
  layout for the rollout's row count (cast to autocast's dtype first), so no decode step re-lays the weights
  out. Measured on qwen2-100m (2-core AMD EPYC, bench/decode_pack.py, bench/precision.py): see docs/performance.md.

Without packing (CUDA, fp16, emulated bf16, no oneDNN), the fused copies are made only while they stay within
:data:`FUSE_MAX_BYTES`: for large matrices fusion would only cost memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.modeling.hooks import RolloutWeights, plain_linear

#: Weight dtypes the rollout packs (from float32 master weights, cast to autocast's bfloat16 when it is on).
PACKABLE = (torch.float32, torch.bfloat16)

#: Without packing, fuse q/k/v and gate/up for a rollout only while the copies stay this small.
FUSE_MAX_BYTES = 32 * 2 ** 20


@dataclass(frozen=True)
class FusedLayer:
    """One layer's projection weights for the length of a rollout: q/k/v and gate/up concatenated
    (copies), o and down as they are (the modules' own tensors) or, when packed, all four as oneDNN-packed
    copies. All go through the rollout hook's ``linear`` (grpo.modeling.hooks.RolloutWeights).

    Shape: qkv [H*d + 2*kv*d, D], qkv_bias [H*d + 2*kv*d] or None, gate_up [2*I, D], o [D, H*d],
    o_bias [D] or None, down [D, I], down_bias [D] or None
    """

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    qkv_sizes: tuple[int, int, int]
    gate_up: torch.Tensor
    o: torch.Tensor
    o_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


def _plain_layer(layer) -> bool:
    """Every projection a plain (or oneDNN-switched) linear layer, the MLP gate/up/down without gate/up biases."""
    attn, mlp = layer.self_attn, layer.mlp
    mods = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
            *(getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj"))]
    return (all(m is not None and plain_linear(m) for m in mods) and hasattr(mlp, "act_fn")
            and mlp.gate_proj.bias is None and mlp.up_proj.bias is None)


def fuse_projections(layers, dtype: torch.dtype | None = None, pack_rows: int | None = None,
                     weights: RolloutWeights | None = None) -> list[FusedLayer] | None:
    """Every layer's projection weights prepared for one rollout, or None when any projection is not a
    plain linear layer (LoRA, quantised, ...) or the MLP is not gate/up/down.

    `pack_rows` (the rollout's rows, from `weights`' ``pack_rows``): all weights packed by ``weights.pack`` for that
    many rows, whatever their size, in `dtype` when given (autocast's: cast, then packed).
    Otherwise the concatenated copies are made only within :data:`FUSE_MAX_BYTES` (else None), in `dtype` when
    given (autocast's, under `train.precision` bf16 / fp16: cast once, not at every decode step).
    """
    if not all(_plain_layer(layer) for layer in layers):
        return None
    if weights is None:
        pack_rows = None                                            # nothing to pack with
    if pack_rows is not None and any(p.dtype not in PACKABLE for layer in layers for p in layer.parameters()):
        pack_rows = None  # packing is for float32 / bfloat16 weights only
    if pack_rows is None:
        size = sum(m.weight.numel() * m.weight.element_size() for layer in layers
                   for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                             layer.mlp.gate_proj, layer.mlp.up_proj))
        if size > FUSE_MAX_BYTES:
            return None

    def ready(w: torch.Tensor | None, own: bool = False) -> torch.Tensor | None:
        """`w` as the decode steps use it: packed (in `dtype`), or as given (`own`: the module's tensor)."""
        if w is None or pack_rows is None:
            return w if own or w is None else w.to(dtype)
        w = w.to(dtype) if dtype is not None else w
        return weights.pack(w, pack_rows) if w.dim() == 2 else w

    fused = []
    with torch.no_grad():
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
            biases = [m.bias for m in qkv]
            fused.append(FusedLayer(
                qkv=ready(torch.cat([m.weight for m in qkv])),  # [H*d + 2*kv*d, D]
                qkv_bias=None if all(b is None for b in biases) else ready(torch.cat(
                    [b if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(qkv, biases)])),
                qkv_sizes=tuple(m.out_features for m in qkv),
                gate_up=ready(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),  # [2*I, D]
                o=ready(attn.o_proj.weight, own=True), o_bias=ready(attn.o_proj.bias, own=True),
                down=ready(mlp.down_proj.weight, own=True), down_bias=ready(mlp.down_proj.bias, own=True),
            ))
    return fused


def packed_head(head, pack_rows: int | None, dtype: torch.dtype | None = None,
                weights: RolloutWeights | None = None) -> torch.Tensor | None:
    """The LM head's weight (cast to `dtype` when given) packed by ``weights.pack`` for `pack_rows` rows, or None (no packing,
    or a head that is not a plain float32 / bfloat16 linear layer: LoRA-adapted heads keep their own forward).

    Shape: [V, D] -> [V, D] (``torch._mkldnn`` layout)
    """
    if pack_rows is None or weights is None or not plain_linear(head) or head.weight.dtype not in PACKABLE:
        return None
    with torch.no_grad():
        return weights.pack(head.weight.to(dtype) if dtype is not None else head.weight, pack_rows)
