"""grpo's causal self-attention for short sequences on the CPU (`cpu.attention_kernel`): forward and backward in
grpo's native library (grpo/cpu/csrc/attention.c, built by grpo.cpu.native_gemm, called as the torch operators
``grpo::attention_forward`` / ``grpo::attention_backward`` of grpo.cpu.ops), for the update's forward+backward passes
and the no-grad passes that share them (old and reference log-probs).

Hugging Face models call their attention through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``.
:func:`use_native_attention` registers :func:`native_or_sdpa` under grpo's own name, :data:`NAME` (with sdpa's mask
function: the masks are sdpa's), and switches only the given model (grpo's policy, from ``CpuRuntime.place``) from
"sdpa" to it; transformers' "sdpa" entry and every other model are left alone. For a call that qualifies (float32
CPU tensors, self-attention of at most :data:`MAX_POSITIONS` positions with a causal or boolean mask, no dropout,
sliding window, soft-capping or position bias) it runs the native kernel; every other call goes to transformers' own
``sdpa_attention_forward`` unchanged.

Measured on the 2-core AMD EPYC (Zen 5) host, forward+backward of qwen2-100m's heads (12 query, 4 key/value,
64 dimensions): [4 rows x 88 positions] 1.45 ms against torch's CPU flash kernel's 2.9 ms, [2 x 280] 7.6 against
10.4, [1 x 536] 13.8 against 17.3; at 1048 positions flash is faster (48 against 57 ms), hence the limit.

Values equal scaled_dot_product_attention's to float32 rounding (tested against float64); a query row with no
allowed key gives zeros (output and gradients).
"""

from __future__ import annotations

import functools

import torch

from grpo.cpu import native_gemm

#: Longest sequence the native kernel takes; longer ones go to torch's flash kernel (faster there, above).
MAX_POSITIONS = 768
#: The attention implementation name grpo registers with transformers (models switched by use_native_attention).
NAME = "grpo_native"


class _AttentionFn(torch.autograd.Function):
    """softmax(scale q k^T + mask) v for grouped-query heads. q [B, Hq, T, D], k / v [B, Hk, T, D] (head dimension
    contiguous), mask [B, T, T] uint8 (1 = may attend) or None (causal) -> o [B, T, Hq, D]; the backward recomputes
    the probabilities from the saved log-sum-exp per row (flash attention's recipe, Dao et al. 2022)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        o, lse = torch.ops.grpo.attention_forward(q, k, v, mask, scale)          # [B, T, Hq, D], [B, Hq, T]
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, mask = ctx.saved_tensors
        dq, dk, dv = torch.ops.grpo.attention_backward(q, k, v, mask, ctx.scale, o, do.contiguous(), lse)
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
    tensors = (query, key, value)       # the device first: another device never builds or loads the library
    if not all(type(t) is torch.Tensor and t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors):
        return False
    if not native_gemm.active("attention"):
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


def native_or_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The :data:`NAME` attention entry: the native kernel where the call qualifies, else transformers' own
    ``sdpa_attention_forward`` with the same arguments. Returns (output [B, T, Hq, D], None) as that function does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _qualifies(module, query, key, value, attention_mask, dropout, kwargs):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return attention(query, key, value, attention_mask, scale), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


@functools.lru_cache(maxsize=None)
def register() -> str:
    """Register :func:`native_or_sdpa` with transformers under :data:`NAME`, with sdpa's mask function (once)."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(NAME, native_or_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_native_attention(model: torch.nn.Module, enabled: bool = True) -> bool:
    """Switch `model` (or the model a peft wrapper wraps) from "sdpa" to :data:`NAME` (`enabled`), or back. Other
    implementations (eager, flash) and other models are untouched. Returns whether the model now uses :data:`NAME`."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    current = getattr(config, "_attn_implementation", None)
    want = (register() if enabled else "sdpa") if current in ("sdpa", NAME) else None
    if want is not None and want != current:
        inner.set_attn_implementation(want)
    return getattr(config, "_attn_implementation", None) == NAME
