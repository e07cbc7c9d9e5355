"""A lean decode step for Llama-family causal LMs (Llama, Mistral, Qwen2, Qwen3) on a static KV cache.

The Hugging Face forward spends much of a small model's decode step in Python and dispatch (mask
creation, ``DynamicCache`` growth by ``torch.cat``, per-layer bookkeeping). For one new token per
row this module replays the math of ``modeling_llama.py`` / ``modeling_qwen2.py`` /
``modeling_qwen3.py`` (transformers 5) directly: embed -> per layer (RMSNorm, q/k/v projections,
[Qwen3: per-head q/k RMSNorm], rotary, attention, o projection, residual, RMSNorm, MLP, residual)
-> final norm -> LM head.

Every projection, norm, embedding and MLP is called as a module, never through its ``.weight``, so
LoRA adapters (peft) and patched ``nn.Linear`` forwards keep working; cos/sin come from the model's
own rotary module, so every RoPE variant it implements stays exact.

Cache: the prompts are prefilled once by the Hugging Face forward and their keys/values kept once
per prompt (not G times); the generated tokens' keys/values go into tensors preallocated for
``max_new_tokens`` and written in place, one column per step. :func:`lean_decoder` returns None for
anything else (other architectures, sliding windows, soft-capping, an unexpected module layout,
peft prompt learning): the caller then keeps the Hugging Face path.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass

import torch

from grpo.modeling.hooks import RolloutWeights, installed
from grpo.modeling.precision import active_dtype, paused
from grpo.modeling.rollout_weights import FusedLayer, fuse_projections, packed_head

#: model_type -> whether each attention head's q and k go through an RMSNorm before rotary (Qwen3).
HEAD_NORM: dict[str, bool] = {"llama": False, "mistral": False, "qwen2": False, "qwen3": True}

_LAYER_PARTS = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
_HEAD_NORMS = ("q_norm", "k_norm")


def cache_inputs(model, cache) -> dict:
    """{keyword: cache} for a forward call: ``cache`` where the model's forward takes it (transformers >= 5.24,
    which deprecates ``past_key_values`` and warns at every call), else ``past_key_values``. For a peft
    wrapper, the model it wraps decides."""
    return {"cache" if "cache" in forward_parameters(model) else "past_key_values": cache}


def forward_parameters(model) -> frozenset[str]:
    """The parameter names of the model's forward (for a peft wrapper, of the model it wraps), looked up once
    per class: the decode steps ask at every token."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _parameters(type(inner))


@functools.lru_cache(maxsize=None)
def _parameters(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def returned_cache(out):
    """The KV cache a forward returned: ``out.cache`` (transformers >= 5.24) or ``out.past_key_values``."""
    return out.cache if "cache" in getattr(out, "__dataclass_fields__", {}) else out.past_key_values


def full_attention_config(config) -> bool:
    """Full causal attention in every layer, no soft-capping."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (getattr(config, "sliding_window", None) is None
            and set(layer_types) == {"full_attention"}
            and getattr(config, "attn_logit_softcapping", None) is None
            and getattr(config, "final_logit_softcapping", None) is None)


def _own_layout(base, model_type: str) -> bool:
    """The module tree of transformers' own ``{Llama,Mistral,Qwen2,Qwen3}ForCausalLM``."""
    inner = getattr(base, "model", None)
    if getattr(base, "lm_head", None) is None or not all(
            hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    source = f"transformers.models.{model_type}.modeling_{model_type}"
    head_norm = HEAD_NORM[model_type]
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if (type(layer).__module__ != source or type(attn).__module__ != source
                or not all(hasattr(layer, name) for name in _LAYER_PARTS)
                or not all(hasattr(attn, name) for name in _ATTN_PARTS)
                or {n for n in _HEAD_NORMS if hasattr(attn, n)} != (set(_HEAD_NORMS) if head_norm else set())):
            return False
    return True


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ``x cos + rotate_half(x) sin`` (HF convention, rotate_half(x) = [-x2, x1]).

    rotate_half(x) sin = [x2, x1] * [-sin1, sin2]: one ``roll`` instead of negating and concatenating.

    Shape:
        x: [n, heads, d], cos/sin_signed: [n, 1, d] -> [n, heads, d]
    """
    return torch.addcmul(x * cos, x.roll(x.size(-1) // 2, dims=-1), sin_signed)  # [n, heads, d]


@dataclass(frozen=True)
class LeanDecoder:
    """The parts of a supported model that one decode step calls (modules, not weights)."""

    model: torch.nn.Module  # the ``*ForCausalLM`` (the model a peft wrapper wraps)
    head_norm: bool  # Qwen3's per-head q_norm / k_norm
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float  # head_dim ** -0.5

    def start(self, cache, prompt_mask: torch.Tensor, num_generations: int, max_new_tokens: int) -> StaticCache:
        """Set up decoding of G samples for each of B prefilled prompts (row i*G+g from prompt i).

        The prompt's keys/values are kept once per prompt (not G times): attention to them is one
        matmul per prompt and kv head over its G*R query rows.

        Shape:
            cache: DynamicCache of batch B over P positions, prompt_mask: [B, P] -> StaticCache of N = B*G rows
        """
        batch, prompt_len = prompt_mask.shape
        kv, d, groups = self.num_kv_heads, self.head_dim, self.num_heads // self.num_kv_heads
        n_rows = batch * num_generations
        keys = cache.layers[0].keys
        lowp = active_dtype(prompt_mask.device)
        weights = installed().rollout                   # the runtime's rollout hook (CPU: oneDNN / native packing)
        pack = weights.pack_rows(keys.device, lowp or keys.dtype, n_rows)
        bias = keys.new_zeros(batch, prompt_len).masked_fill_(prompt_mask == 0, float("-inf"))  # [B, P]
        return StaticCache(
            prompt_keys=[layer.keys.transpose(2, 3).reshape(batch * kv, d, prompt_len) for layer in cache.layers],
            prompt_values=[layer.values.to(keys.dtype).reshape(batch * kv, prompt_len, d)  # one dtype, as keys
                           for layer in cache.layers],
            prompt_bias=bias[:, None, None, :].expand(batch, kv, num_generations * groups, prompt_len)
            .reshape(batch * kv, num_generations * groups, prompt_len),  # [B*kv, G*R, P]
            keys=[keys.new_empty(n_rows, kv, max_new_tokens, d) for _ in cache.layers],
            values=[keys.new_empty(n_rows, kv, max_new_tokens, d) for _ in cache.layers],
            rows=torch.arange(n_rows, device=prompt_mask.device),
            positions=prompt_mask.long().sum(dim=-1).repeat_interleave(num_generations),  # [N]
            num_generations=num_generations,
            num_kv_heads=kv,
            fused=fuse_projections(self.model.model.layers, lowp, pack, weights),
            head=packed_head(self.model.lm_head, pack, lowp, weights),
            weights=weights,
        )

    def step(self, cache: StaticCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; return next-token logits and advance the cache by one column.

        Shape:
            tokens: [n] -> [n, V]
        """
        inner = self.model.model
        h = inner.embed_tokens(tokens)  # [n, D]
        cos, sin = inner.rotary_emb(h, cache.positions[:, None])  # [n, 1, d] each
        sin = torch.cat((-sin[..., :self.head_dim // 2], sin[..., self.head_dim // 2:]), dim=-1)  # signed [n, 1, d]
        rope = (cos, sin, cos * self.scaling, sin * self.scaling)  # the query's carries the score scaling
        lowp = active_dtype(h.device)  # autocast: cast each norm's output once, not once per projection
        for i, layer in enumerate(inner.layers):
            x = layer.input_layernorm(h)  # [n, D]
            h = h + self.attend(layer.self_attn, x if lowp is None else x.to(lowp), rope, cache, i)  # [n, D]
            x = layer.post_attention_layernorm(h)  # [n, D]
            h = h + self.mlp(layer.mlp, x if lowp is None else x.to(lowp), cache.fused[i] if cache.fused else None,
                             cache.weights)
        cache.length, cache.positions = cache.length + 1, cache.positions + 1
        head, x = self.model.lm_head, inner.norm(h)
        if cache.head is not None:  # this rollout's packed copy
            return cache.weights.linear(x, cache.head, head.bias)  # [n, V]
        return cache.weights.head(head, x)  # [n, V] (CPU: a plain head through oneDNN, 2x MKL at 16 rows x 32k vocab)

    @staticmethod
    def mlp(mlp, x: torch.Tensor, fused: FusedLayer | None, weights: RolloutWeights) -> torch.Tensor:
        """down(act(gate(x)) * up(x)), gate and up as one GEMM when fused.  Shape: [n, D] -> [n, D]"""
        if fused is None:
            return mlp(x)  # [n, D]
        gate, up = weights.linear(x, fused.gate_up).chunk(2, dim=-1)  # [n, I] x 2
        return weights.linear(mlp.act_fn(gate) * up, fused.down, fused.down_bias)  # [n, D]

    def attend(self, attn, x, rope, cache: StaticCache, i: int) -> torch.Tensor:
        """Layer ``i``'s self-attention for one new token per row; writes its k/v into the cache.

        softmax(q k^T * scaling + mask) v over the prompt then the generated tokens, the softmax in
        float32 as in ``eager_attention_forward``. The R = heads / kv_heads query heads sharing a kv
        head (GQA: head h reads kv head h // R) are R query rows of one matmul: K/V are never repeated.

        Under autocast (`train.precision`) the projections run in its dtype and the attention itself
        with autocast paused, in the cache's dtype (float32 for a float32 model): on the CPU, bfloat16
        batched matmuls are no faster at these shapes, and oneDNN would build and keep a kernel for
        every new key length t + 1 (~130 MiB more resident memory on qwen2-100m).

        Shape:
            x: [n, D], rope: (cos, signed sin, both times scaling) each [n, 1, d] -> [n, D]
        """
        n, kv, d = x.size(0), self.num_kv_heads, self.head_dim
        fused = cache.fused[i] if cache.fused else None
        if fused is not None:  # one GEMM for q, k and v
            q, k, v = cache.weights.linear(x, fused.qkv, fused.qkv_bias).split(fused.qkv_sizes, dim=-1)  # [n, H*d], [n, kv*d] x 2
            q, k, v = q.view(n, self.num_heads, d), k.view(n, kv, d), v.view(n, kv, d)
        else:
            q = attn.q_proj(x).view(n, self.num_heads, d)  # [n, H, d]
            k = attn.k_proj(x).view(n, kv, d)  # [n, kv, d]
            v = attn.v_proj(x).view(n, kv, d)  # [n, kv, d]
        if self.head_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)  # [n, H, d], [n, kv, d]
        with paused(x.device):
            out = self.cached_attention(q, k, v, rope, cache, i).view(n, -1)  # [n, H*d]
        return attn.o_proj(out) if fused is None else cache.weights.linear(out, fused.o, fused.o_bias)  # [n, D]

    @staticmethod
    def cached_attention(q, k, v, rope, cache: StaticCache, i: int) -> torch.Tensor:
        """Rotate q and k, write k and v into layer ``i``'s cache column, attend over prompt and new tokens.

        Shape:
            q: [n, H, d], k, v: [n, kv, d] -> [n*kv, R, d]
        """
        n, kv, d, t = q.size(0), k.size(1), q.size(-1), cache.length
        keys, values = cache.keys[i], cache.values[i]  # [n, kv, T, d] each
        keys[:, :, t] = rotate(k, rope[0], rope[1])  # [n, kv, d]
        values[:, :, t] = v  # [n, kv, d]
        q = rotate(q, rope[2], rope[3]).to(keys.dtype).view(n * kv, -1, d)  # [n*kv, R, d] times scaling
        on_prompt = torch.baddbmm(cache.prompt_bias, cache.by_prompt(q), cache.prompt_keys[i])  # [B*kv, G*R, P]
        on_new = torch.bmm(q, keys[:, :, :t + 1].reshape(n * kv, t + 1, d).transpose(1, 2))  # [n*kv, R, t+1]
        scores = torch.cat([cache.to_rows(on_prompt), on_new], dim=-1)  # [n*kv, R, P+t+1]
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)  # [n*kv, R, P+t+1] float32 as in HF
        p = on_prompt.size(-1)
        from_prompt = torch.bmm(cache.by_prompt(probs[..., :p]), cache.prompt_values[i])  # [B*kv, G*R, d]
        new_values = values[:, :, :t + 1].reshape(n * kv, t + 1, d)  # [n*kv, t+1, d]
        return torch.baddbmm(cache.to_rows(from_prompt), probs[..., p:], new_values)  # [n*kv, R, d]


@dataclass
class StaticCache:
    """Keys/values of a rollout: the prompts' once per prompt, the generated tokens' preallocated per row.

    Shape (B prompts, G samples each, N = B*G rows of which n still run, R = heads / kv_heads):
        prompt_keys: per layer [B*kv, d, P] (transposed: q k^T is a plain matmul).
        prompt_values: per layer [B*kv, P, d].
        prompt_bias: [B*kv, G*R, P] attention-score mask, -inf on the prompt's left padding, else 0.
        keys, values: per layer [n, kv, max_new_tokens, d]; positions >= length are unset.
        rows: [n] long, the row (0..N-1) of each running sequence.
        positions: [n] long, position id of the next token (real tokens before it).
    """

    prompt_keys: list[torch.Tensor]
    prompt_values: list[torch.Tensor]
    prompt_bias: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    rows: torch.Tensor
    positions: torch.Tensor
    num_generations: int
    num_kv_heads: int
    fused: list[FusedLayer] | None = None  # this rollout's fused projections (small models)
    head: torch.Tensor | None = None  # this rollout's packed LM head weight (CPU float32 / bf16)
    weights: RolloutWeights = dataclasses.field(default_factory=RolloutWeights)  # how the packed copies multiply
    length: int = 0  # generated tokens cached so far
    compacted: bool = False  # some rows have left

    @property
    def num_rows(self) -> int:
        """N = B * G, the rows the rollout started with."""
        return self.prompt_bias.size(0) // self.num_kv_heads * self.num_generations

    def by_prompt(self, x: torch.Tensor) -> torch.Tensor:
        """Running rows' per-kv-head blocks regrouped by prompt (zeros for rows that have left).

        Shape:
            x: [n*kv, R, k] -> [B*kv, G*R, k]
        """
        g, (_, groups, k) = self.num_generations, x.shape
        x = x.view(len(self.rows), -1, groups, k)  # [n, kv, R, k]
        if self.compacted:
            x = x.new_zeros(self.num_rows, *x.shape[1:]).index_copy_(0, self.rows, x)  # [N, kv, R, k]
        kv = x.size(1)
        return x.view(-1, g, kv, groups, k).transpose(1, 2).reshape(-1, g * groups, k)  # [B*kv, G*R, k]

    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`by_prompt`, keeping only the running rows.

        Shape:
            x: [B*kv, G*R, k] -> [n*kv, R, k]
        """
        g, kv, k = self.num_generations, self.num_kv_heads, x.size(-1)
        x = x.view(-1, kv, g, x.size(1) // g, k).transpose(1, 2)  # [B, G, kv, R, k]
        x = x.reshape(self.num_rows, kv, -1, k)  # [N, kv, R, k]
        if self.compacted:
            x = x.index_select(0, self.rows)  # [n, kv, R, k]
        return x.reshape(-1, x.size(2), k)  # [n*kv, R, k] (a copy when B = 1: the reshape above was a strided view)

    def select(self, kept: torch.Tensor) -> None:
        """Keep only rows ``kept`` (finished rows leave the batch).

        Shape:
            kept: [n'] long
        """
        self.keys = [k.index_select(0, kept) for k in self.keys]  # [n', kv, T, d] each
        self.values = [v.index_select(0, kept) for v in self.values]  # [n', kv, T, d] each
        self.rows, self.positions = self.rows[kept], self.positions[kept]  # [n'], [n']
        self.compacted = True


def lean_decoder(model) -> LeanDecoder | None:
    """The lean decode path for ``model`` (or the model a peft wrapper wraps), None if unsupported.

    Supported: transformers' own Llama / Mistral / Qwen2 / Qwen3 causal LMs with full attention in
    every layer (no sliding window) and no soft-capping; peft adapters other than prompt learning.
    """
    peft_config = getattr(model, "active_peft_config", None)
    if getattr(peft_config, "is_prompt_learning", False):  # virtual tokens are added by the wrapper's forward
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in HEAD_NORM or not full_attention_config(config) or not _own_layout(base, model_type):
        return None
    attn = base.model.layers[0].self_attn
    return LeanDecoder(
        model=base,
        head_norm=HEAD_NORM[model_type],
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=attn.head_dim,
        scaling=attn.scaling,
    )


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids under left padding: index among the real tokens, 0 on padding.

    Shape:
        mask: [n, L] -> [n, L] long
    """
    return (mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [n, L]
