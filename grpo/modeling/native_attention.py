"""grpo's causal self-attention for short sequences on the CPU (`train.attention_kernel`): forward and backward in
grpo's native library (grpo/modeling/csrc/attention.c, built by grpo.modeling.native_gemm), for the update's
forward+backward passes and the no-grad passes that share them (old and reference log-probs).

Hugging Face models call their attention through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``.
:func:`use_native_attention` marks a model's attention modules and registers :func:`sdpa_or_native` as the "sdpa"
entry: for a marked module whose call qualifies (float32 CPU tensors, self-attention of at most :data:`MAX_POSITIONS`
positions with a causal or boolean mask, no dropout, sliding window, soft-capping or position bias) it runs the
native kernel; every other call, and every unmarked module, goes to transformers' own ``sdpa_attention_forward``
unchanged.

Measured on the 2-core AMD EPYC (Zen 5) host, forward+backward of qwen2-100m's heads (12 query, 4 key/value,
64 dimensions): [4 rows x 88 positions] 1.45 ms against torch's CPU flash kernel's 2.9 ms, [2 x 280] 7.6 against
10.4, [1 x 536] 13.8 against 17.3; at 1048 positions flash is faster (48 against 57 ms), hence the limit.

Values equal scaled_dot_product_attention's to float32 rounding (tested against float64); a query row with no
allowed key gives zeros (output and gradients).
"""

from __future__ import annotations

import ctypes

import torch

from grpo.modeling import native_gemm

#: Longest sequence the native kernel takes; longer ones go to torch's flash kernel (faster there, above).
MAX_POSITIONS = 768

_original_sdpa = None


def _longs(values) -> ctypes.Array:
    return (ctypes.c_long * len(values))(*values)


class _AttentionFn(torch.autograd.Function):
    """softmax(scale q k^T + mask) v for grouped-query heads. q [B, Hq, T, D], k / v [B, Hk, T, D] (head dimension
    contiguous), mask [B, T, T] uint8 (1 = may attend) or None (causal) -> o [B, T, Hq, D]; the backward recomputes
    the probabilities from the saved log-sum-exp per row (flash attention's recipe, Dao et al. 2022)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        B, Hq, T, D = q.shape
        dims = _longs([B, Hq, k.shape[1], T, D])
        strides = [_longs(t.stride()[:3]) for t in (q, k, v)]
        o = q.new_empty(B, T, Hq, D)
        lse = q.new_empty(B, Hq, T)
        status = native_gemm.library().grpo_attention_forward(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), dims, *strides, None if mask is None else mask.data_ptr(),
            scale, o.data_ptr(), lse.data_ptr())
        if status:
            raise MemoryError("native_attention: no memory for the attention's work buffers")
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, mask = ctx.saved_tensors
        B, Hq, T, D = q.shape
        do = do.contiguous()
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)           # [B, Hq, T, D]
        dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)                       # [B, Hk, T, D]
        status = native_gemm.library().grpo_attention_backward(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), _longs([B, Hq, k.shape[1], T, D]),
            *[_longs(t.stride()[:3]) for t in (q, k, v)], None if mask is None else mask.data_ptr(), ctx.scale,
            o.data_ptr(), do.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
        if status:
            raise MemoryError("native_attention: no memory for the attention's work buffers")
        return dq, dk, dv, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    """Causal (mask None) or masked self-attention of grouped-query heads by the native kernel.

    Shape: q [B, Hq, T, D], k / v [B, Hk, T, D] float32 CPU with Hq a multiple of Hk; mask boolean, broadcastable to
    [B, 1, T, T] (True = may attend) -> [B, T, Hq, D]
    """
    B, Hq, T, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[2:] != (T, D) or Hq % k.shape[1]:
        raise ValueError(f"native_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} are not "
                         f"grouped-query self-attention heads")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    m = None if mask is None else mask.expand(B, 1, T, T)[:, 0].to(torch.uint8).contiguous()
    return _AttentionFn.apply(q, k, v, m, float(scale))


def _qualifies(module, query, key, value, attention_mask, dropout, kwargs) -> bool:
    """The native kernel serves this call (see the module docstring)."""
    if not getattr(module, "grpo_native_attention", False) or not native_gemm.active("attention"):
        return False
    tensors = (query, key, value)
    if not all(type(t) is torch.Tensor and t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors):
        return False
    T = query.shape[2]
    if query.dim() != 4 or key.shape[2] != T or T > MAX_POSITIONS or query.shape[1] % key.shape[1]:
        return False
    if dropout or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return False
    if kwargs.get("output_attentions") or (kwargs.get("sliding_window") or T) < T:
        return False
    if attention_mask is None:
        return getattr(module, "is_causal", True) and kwargs.get("is_causal") is not False
    return (attention_mask.dtype == torch.bool and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
            and attention_mask.shape[2:] == (T, T) and attention_mask.shape[0] in (1, query.shape[0]))


def sdpa_or_native(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The "sdpa" attention entry while :func:`use_native_attention` is on: the native kernel where the call
    qualifies, else transformers' own ``sdpa_attention_forward`` with the same arguments. Returns
    (output [B, T, Hq, D], None) as that function does."""
    if _qualifies(module, query, key, value, attention_mask, dropout, kwargs):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return attention(query, key, value, attention_mask, scale), None
    return _original_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def use_native_attention(model: torch.nn.Module, enabled: bool = True) -> int:
    """Mark (`enabled`) or unmark the attention modules of `model` (those with ``num_key_value_groups``, as
    transformers' decoders have) for :func:`sdpa_or_native`, registered once as the "sdpa" attention entry. Only
    marked modules of models whose ``config._attn_implementation`` is "sdpa" are affected. Returns how many
    modules were marked or unmarked."""
    global _original_sdpa
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    if _original_sdpa is None:
        _original_sdpa = sdpa_attention_forward
        AttentionInterface.register("sdpa", sdpa_or_native)
    count = 0
    for module in model.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "head_dim"):
            module.grpo_native_attention = enabled
            count += 1
    return count
