"""Prompt-shared forward passes: each distinct prompt of a micro-batch goes through the model once.

GRPO trains on G completions of every prompt. The plain forward runs the prompt's tokens G times
(once per row), in the reference pass and in both directions of the update. Here the distinct
prompts of a micro-batch run once, with the model's own key/value cache; the cache is then indexed
out to the rows (autograd carries every row's gradient back to the shared prompt pass) and the
completions run against it. The hidden states are those of the plain forward (same masks and
positions; only the summation order of attention differs), so log-probs agree to float rounding
and gradients flow to the same parameters.

Used when it saves at least :data:`MIN_SAVING` of the micro-batch's tokens, the model keeps a plain
``DynamicCache`` (full attention: no sliding window, no hybrid layers) and no activation
checkpointing is active (Hugging Face layers drop the cache under checkpointing).

Bit for bit: the rows are indexed out with :func:`expand_rows`, whose backward adds each prompt's row
gradients in a fixed order. The cache's own ``batch_select_indices`` (``keys[indices]``) has an
``index_put_(accumulate=True)`` backward that, with more than one CPU thread, adds them in the order
the threads happen to run: two identical steps differed by ~1e-9 in the gradients.
"""

from __future__ import annotations

import torch

from grpo.modeling.decoder import cache_inputs, full_attention_config, positions_from_mask, returned_cache

#: Share only when the distinct prompts save at least this share of the micro-batch's tokens. The
#: second forward call and the cache gather have a cost: at a 10 % saving (qwen2-100m, 3 rows of one
#: prompt per micro-batch) the update was slower and its peak RSS 200 MiB higher; at 18-22 % (the
#: embedded task, 3-4 rows per prompt) it is 13 % faster and 35 MiB lighter.
MIN_SAVING = 0.15


def distinct_prompts(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the distinct (token, mask) prompts and each row's prompt among them.

    Shape:
        ids, mask: [n, P] -> first: [U] long (one row holding each distinct prompt), inverse: [n] long in [0, U)
    """
    key = torch.cat([ids * mask, mask], dim=1)                                # [n, 2P] padding compares equal
    _, inverse = torch.unique(key, dim=0, return_inverse=True)                 # [n]
    first = torch.full((int(inverse.max()) + 1,), -1, dtype=torch.long, device=ids.device)
    first.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=ids.device), "amin", include_self=False)
    return first, inverse


def checkpointing(backbone: torch.nn.Module) -> bool:
    """Whether activation checkpointing is on in any layer (then the layers would drop a cache)."""
    return backbone.training and any(getattr(m, "gradient_checkpointing", False) for m in backbone.modules())


def plain_cache_model(backbone: torch.nn.Module) -> bool:
    """Full attention in every layer (the lean decoder's test): the prompt's cache is a ``DynamicCache``
    of plain layers."""
    config = getattr(backbone, "config", None)
    return config is not None and full_attention_config(config)


def group_sum(x: torch.Tensor, inverse: torch.Tensor, groups: int, counts: list[int] | None = None) -> torch.Tensor:
    """Sum of the rows of `x` that share an index in `inverse`, in a fixed order (run to run).

    Each group's rows are gathered in row order and summed with one reduction per group, so the
    result does not depend on thread scheduling (``index_put_`` with ``accumulate=True``, the
    backward of ``x[inverse]``, does on a multi-threaded CPU).

    Shape:
        x: [n, ...], inverse: [n] long in [0, groups) -> [groups, ...]; `counts`: rows per group, known on the
        host (None: counted from `inverse`, a device read)
    """
    order = torch.argsort(inverse, stable=True)                                 # [n] rows grouped, in row order
    if counts is None:
        counts = torch.bincount(inverse, minlength=groups).tolist()             # [groups] rows per group
    parts = x.index_select(0, order).split(counts)                              # groups x [count, ...]
    return torch.stack([part.sum(dim=0) for part in parts])                     # [groups, ...]


class _ExpandRows(torch.autograd.Function):
    """y = x[inverse] whose backward is :func:`group_sum` (deterministic)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, inverse: torch.Tensor, counts: list[int] | None) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.groups, ctx.counts = x.shape[0], counts
        return x.index_select(0, inverse)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return group_sum(grad, inverse, ctx.groups, ctx.counts), None, None


def expand_rows(x: torch.Tensor, inverse: torch.Tensor, counts: list[int] | None = None) -> torch.Tensor:
    """Row `inverse[i]` of `x` as row i; the gradients of a shared row add up in a fixed order (`counts`: rows per
    shared row, known on the host; None: counted in the backward).

    Shape:
        x: [U, ...], inverse: [n] long in [0, U) -> [n, ...]
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _ExpandRows.apply(x, inverse, counts)
    return x.index_select(0, inverse)


def expand_cache(cache, inverse: torch.Tensor, counts: list[int] | None = None) -> None:
    """Index every layer's keys and values out to the rows (:func:`expand_rows`), in place.

    Shape:
        cache: DynamicCache of batch U -> of batch n, inverse: [n] long in [0, U)
    """
    for layer in cache.layers:
        layer.keys = expand_rows(layer.keys, inverse, counts)                   # [n, kv, P, d]
        layer.values = expand_rows(layer.values, inverse, counts)               # [n, kv, P, d]


def causal_only_mask(mask: torch.Tensor) -> torch.Tensor:
    """The attention mask with each row's trailing padding (the columns after its last real token) set to 1.

    Under causal attention no real token attends to a later column, so trailing padding (after EOS) needs no
    mask: the real tokens' hidden states and positions do not change. A micro-batch without left padding then
    has an all-ones mask, and transformers lets the attention kernel run causal (sdpa ``is_causal``) instead of
    materialising an ``[n, 1, L, L]`` mask, quadratic in the length (80 MiB per row at L = 4096 on CPU sdpa:
    the boolean mask and its float copy).

    Shape: [n, L] -> [n, L]
    """
    later = mask.flip(-1).cumsum(dim=-1).flip(-1) > 0                         # [n, L] a real token here or later
    return torch.where(later, mask, torch.ones_like(mask))                     # [n, L]


def _expandable(cache) -> bool:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def completion_hidden(backbone: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, kept: int,
                      host_ids: torch.Tensor | None = None, host_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Hidden states at the positions that predict the last ``kept`` tokens of each row.

    ``ids``/``mask`` are one trimmed micro-batch: left-padded prompts, then ``kept`` completion
    columns. Distinct prompts run once when that pays (see the module docstring); otherwise, or
    for models without a plain cache, one plain forward over the whole rows. Which rows share a prompt is
    decided on the host, from `host_ids` / `host_mask` (the same micro-batch on the CPU; None: `ids` / `mask`
    themselves, on the CPU), so nothing is read back from an accelerator.

    Shape:
        ids, mask (host_ids, host_mask): [n, P + kept] -> [n, kept, H]
    """
    n, P = ids.shape[0], ids.shape[1] - kept
    host_ids, host_mask = (ids, mask) if host_ids is None else (host_ids, host_mask)
    mask, host_mask = causal_only_mask(mask), causal_only_mask(host_mask)       # no [L, L] mask for trailing pads
    positions = positions_from_mask(mask)                                       # [n, P + kept]
    first = inverse = None
    if P > 0 and bool(host_mask[:, P - 1].all()) and plain_cache_model(backbone) and not checkpointing(backbone):
        first, inverse = distinct_prompts(host_ids[:, :P], host_mask[:, :P])   # on the host
        if (n - len(first)) * P < MIN_SAVING * n * (P + kept):
            first = None
    if first is not None:
        counts = torch.bincount(inverse, minlength=len(first)).tolist()        # [U] rows per prompt, host
        on_host = host_mask[first, :P]                                          # [U, P] the prompts' mask, host
        first, inverse = first.to(ids.device), inverse.to(ids.device)
        out = backbone(input_ids=ids[first, :P], attention_mask=prepared_mask(backbone, mask[first, :P], on_host),
                       position_ids=positions[first, :P], use_cache=True)       # [U, P, H] and the cache
        cache = returned_cache(out)
        if _expandable(cache):
            expand_cache(cache, inverse, counts)                                # [n, kv, P, d] per layer
            rest = backbone(input_ids=ids[:, P:], attention_mask=prepared_mask(backbone, mask, host_mask, P),
                            position_ids=positions[:, P:], **cache_inputs(backbone, cache),
                            use_cache=True).last_hidden_state                   # [n, kept, H]
            last = expand_rows(out.last_hidden_state[:, -1:], inverse, counts) # [n, 1, H] predicts column P
            return torch.cat([last, rest[:, :-1]], dim=1)                       # [n, kept, H]
    hidden = backbone(input_ids=ids, attention_mask=prepared_mask(backbone, mask, host_mask), position_ids=positions,
                      use_cache=False).last_hidden_state
    return hidden[:, -kept - 1:-1]                                              # [n, kept, H]


def prepared_mask(backbone: torch.nn.Module, mask: torch.Tensor, host_mask: torch.Tensor,
                  q_offset: int = 0) -> torch.Tensor | None:
    """The attention mask of a forward whose queries are the columns from `q_offset` on (keys: all of `mask`'s),
    decided on the host so that transformers need not read the mask back from the device to pick its kernel:
    None when no column is padding (the kernel runs causal; transformers would choose the same after reading an
    all-ones mask), else, for attention with sdpa's mask (sdpa, grpo's native kernel), the boolean mask
    transformers would build itself: key <= query position, and the key not padding. Others get `mask` as it is.

    Shape: mask, host_mask [n, L] (trailing padding already 1) -> None | [n, 1, L - q_offset, L] bool | [n, L]
    """
    if bool(host_mask.all()):
        return None
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    impl = getattr(getattr(backbone, "config", None), "_attn_implementation", None)
    if ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(impl) is not sdpa_mask:
        return mask
    L = mask.shape[1]
    q = torch.arange(q_offset, L, device=mask.device)                          # [L - q_offset] query positions
    kv = torch.arange(L, device=mask.device)                                    # [L] key positions
    return (kv[None, :] <= q[:, None])[None, None] & mask.bool()[:, None, None, :]   # [n, 1, q, L]
