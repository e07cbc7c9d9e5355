"""Batched autoregressive sampling of G completions per prompt, with a KV cache.

The prompts of a batch are prefilled once; the resulting KV cache and last-position logits are
then repeated G times along the batch dimension (``repeat_interleave``), so row ``i * G + g``
holds sample ``g`` of prompt ``i``. Decoding feeds one token per step and drops finished rows from
the batch (and from the cache), so the cost of a step only depends on the rows still running.

Randomness contract (what a reference implementation must mirror to reproduce tokens exactly):
at each step exactly one ``torch.multinomial(probs, 1, generator=generator)`` call is made, where
``probs`` is ``[n_running, V]`` with the still-running rows in increasing row order. Greedy
decoding (``temperature == 0``) draws nothing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Generation:
    """Output of :func:`sample`; N = B * G rows, row ``i * G + g`` is sample ``g`` of prompt ``i``.

    Shape:
        prompt_ids, prompt_mask: [N, P] long, left-padded, mask 1 on real prompt tokens.
        completion_ids: [N, T] long, ``pad_token_id`` after EOS; T = longest completion produced.
        completion_mask: [N, T] long, 1 up to and including the EOS token, 0 after.
        sampling_logprobs: [N, T] float32, log-prob of each token under the distribution it was
            sampled from (after temperature / top-k / top-p); 0 where the mask is 0.
        truncated: [N] bool, True when the completion hit ``max_new_tokens`` without EOS.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    truncated: torch.Tensor


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p (nucleus) filtering; removed entries become -inf.

    ``top_k == 0`` and ``top_p >= 1`` disable the corresponding filter. Top-k keeps ties with the
    k-th largest logit. Top-p keeps the smallest prefix of the descending-sorted distribution whose
    cumulative probability reaches ``top_p`` (always at least the most likely token).
    ``temperature`` must be > 0 (greedy decoding does not filter).

    Shape:
        logits: [..., V] -> [..., V] float32
    """
    logits = logits.float() / temperature  # [..., V]
    if top_k > 0:
        kth_largest = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))  # [..., V]
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [..., V]
        sorted_probs = sorted_logits.softmax(dim=-1)  # [..., V]
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V]
        drop_sorted = mass_before >= top_p  # [..., V] the prefix before this token already suffices
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # [..., V] back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))  # [..., V]
    return logits


def choose_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return it with its log-prob under the distribution it came from.

    ``temperature == 0`` is greedy: argmax of the raw logits, log-prob from their log-softmax.
    Otherwise one ``torch.multinomial`` draw over the filtered distribution.

    Shape:
        logits: [n, V] -> tokens [n] long, logprobs [n] float32
    """
    if temperature == 0:
        logprobs = F.log_softmax(logits.float(), dim=-1)  # [n, V]
        tokens = logprobs.argmax(dim=-1)  # [n]
    else:
        logprobs = F.log_softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)  # [n, V]
        tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)  # [n]
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # [n], [n]


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids under left padding: index among the real tokens, 0 on padding.

    Shape:
        mask: [n, L] -> [n, L] long
    """
    return (mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [n, L]


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after (works when pad == EOS).

    Shape:
        completion_ids: [N, T] -> [N, T] long
    """
    is_eos = (completion_ids == eos_token_id).long()  # [N, T]
    eos_seen_before = is_eos.cumsum(dim=-1) - is_eos  # [N, T]
    return (eos_seen_before == 0).long()  # [N, T]


def _last_logits(model, **inputs) -> tuple[torch.Tensor, object]:
    """Forward ``inputs`` with the cache on; return the last position's logits and the cache.

    Only the last position goes through the LM head when the model accepts ``logits_to_keep``
    (a peft wrapper forwards it to the model it wraps, whose signature is the one checked).

    Shape:
        inputs["input_ids"]: [n, L] -> logits [n, V]
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if "logits_to_keep" in inspect.signature(inner.forward).parameters:
        inputs["logits_to_keep"] = 1
    out = model(**inputs, use_cache=True)
    return out.logits[:, -1, :], out.past_key_values  # [n, V]


def prefill_shared(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int):
    """Run the B prompts once and repeat cache and next-token logits G times (row i*G+g).

    Shape:
        prompt_ids, prompt_mask: [B, P] -> logits [B*G, V], cache of batch B*G
    """
    logits, cache = _last_logits(
        model,
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=positions_from_mask(prompt_mask),  # [B, P]
        past_key_values=None,  # the model builds the cache type it needs (DynamicCache)
    )
    cache.batch_repeat_interleave(num_generations)
    return logits.repeat_interleave(num_generations, dim=0), cache  # [N, V]


def decode_step(model, tokens: torch.Tensor, attention_mask: torch.Tensor, cache) -> torch.Tensor:
    """Feed one new token per row; ``attention_mask`` already covers it. Returns next logits.

    Shape:
        tokens: [n], attention_mask: [n, L] -> [n, V]
    """
    logits, _ = _last_logits(
        model,
        input_ids=tokens[:, None],  # [n, 1]
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask)[:, -1:],  # [n, 1]
        past_key_values=cache,
    )
    return logits  # [n, V]


@torch.no_grad()
def sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> Generation:
    """Sample ``num_generations`` completions for each left-padded prompt (see module docstring).

    The model is put in eval mode while sampling and its training flag is restored afterwards.

    Shape:
        prompt_ids, prompt_mask: [B, P] -> Generation with N = B * num_generations rows
    """
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device).long()  # [B, P]
        n_rows = prompt_ids.size(0) * num_generations
        logits, cache = prefill_shared(model, prompt_ids, prompt_mask, num_generations)  # [N, V]
        attention_mask = prompt_mask.repeat_interleave(num_generations, dim=0)  # [n, P + t]
        running = torch.arange(n_rows, device=device)  # [n] row index of each running sequence
        completion_ids = torch.full((n_rows, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(n_rows, max_new_tokens, dtype=torch.float32, device=device)  # [N, max_new]
        steps = 0
        for step in range(max_new_tokens):
            tokens, token_logprobs = choose_tokens(logits, temperature, top_k, top_p, generator)  # [n], [n]
            completion_ids[running, step] = tokens
            logprobs[running, step] = token_logprobs
            steps = step + 1
            keep = tokens != eos_token_id  # [n]
            if steps == max_new_tokens or not keep.any():
                break
            if not keep.all():  # drop finished rows from the batch and the cache
                kept = keep.nonzero().squeeze(-1)  # [n']
                cache.batch_select_indices(kept)
                running, tokens, attention_mask = running[kept], tokens[kept], attention_mask[kept]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(running), 1)], dim=-1)
            logits = decode_step(model, tokens, attention_mask, cache)  # [n, V]
    finally:
        model.train(was_training)

    completion_ids = completion_ids[:, :steps]  # [N, T]
    completion_mask = completion_mask_from_ids(completion_ids, eos_token_id)  # [N, T]
    ended_with_eos = ((completion_ids == eos_token_id) & completion_mask.bool()).any(dim=-1)  # [N]
    return Generation(
        prompt_ids=prompt_ids.repeat_interleave(num_generations, dim=0),  # [N, P]
        prompt_mask=prompt_mask.repeat_interleave(num_generations, dim=0),  # [N, P]
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        sampling_logprobs=logprobs[:, :steps] * completion_mask,  # [N, T]
        truncated=~ended_with_eos,  # [N]
    )
