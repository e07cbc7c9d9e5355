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
"""

from __future__ import annotations

import torch

from grpo.rollout.decoder import full_attention_config
from grpo.rollout.sampler import positions_from_mask

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


def _expandable(cache) -> bool:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def completion_hidden(backbone: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, kept: int) -> torch.Tensor:
    """Hidden states at the positions that predict the last ``kept`` tokens of each row.

    ``ids``/``mask`` are one trimmed micro-batch: left-padded prompts, then ``kept`` completion
    columns. Distinct prompts run once when that pays (see the module docstring); otherwise, or
    for models without a plain cache, one plain forward over the whole rows.

    Shape:
        ids, mask: [n, P + kept] -> [n, kept, H]
    """
    n, P = ids.shape[0], ids.shape[1] - kept
    positions = positions_from_mask(mask)                                       # [n, P + kept]
    first = inverse = None
    if P > 0 and bool(mask[:, P - 1].all()) and plain_cache_model(backbone) and not checkpointing(backbone):
        first, inverse = distinct_prompts(ids[:, :P], mask[:, :P])
        if (n - len(first)) * P < MIN_SAVING * n * (P + kept):
            first = None
    if first is not None:
        out = backbone(input_ids=ids[first, :P], attention_mask=mask[first, :P], position_ids=positions[first, :P],
                       use_cache=True)                                          # [U, P, H] and the cache
        cache = out.past_key_values
        if _expandable(cache):
            cache.batch_select_indices(inverse)                                 # [n, kv, P, d] per layer
            rest = backbone(input_ids=ids[:, P:], attention_mask=mask, position_ids=positions[:, P:],
                            past_key_values=cache, use_cache=True).last_hidden_state   # [n, kept, H]
            last = out.last_hidden_state[:, -1:].index_select(0, inverse)      # [n, 1, H] predicts column P
            return torch.cat([last, rest[:, :-1]], dim=1)                       # [n, kept, H]
    hidden = backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
    return hidden[:, -kept - 1:-1]                                              # [n, kept, H]
