"""Batched autoregressive sampling of G completions per prompt, with a KV cache.

The prompts of a batch are prefilled once; their last-position logits are repeated G times along
the batch dimension (``repeat_interleave``), so row ``i * G + g`` holds sample ``g`` of prompt ``i``.
Decoding feeds one token per step and drops finished rows from the batch (and from the cache), so
the cost of a step only depends on the rows still running. Llama-family models decode through the
lean decoder of :mod:`grpo.modeling.decoder` (prompt keys/values kept once per prompt, a static cache
for the new tokens, no per-step Hugging Face overhead); other models run their own forward on the
prompts' ``DynamicCache`` repeated G times.

Randomness contract (what a reference implementation must mirror to reproduce tokens exactly):
token ``t`` of row ``i * G + g`` is drawn by :func:`draw` with the uniform
``token_uniforms(row_keys(seed, prompt_index, G), t)[i * G + g]`` (grpo/rollout/keyed.py): a pure
function of (seed, the prompt's global index, g, t), whatever else is in the batch and whichever
rows have already finished. Greedy decoding (``temperature == 0``) draws nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch

from grpo.modeling.precision import cast_frozen_linears
from grpo.modeling.decoder import (LeanDecoder, StaticCache, cache_inputs, forward_parameters, lean_decoder,
                                   positions_from_mask, returned_cache)
from grpo.rollout.choice import Scratch, choose_tokens, draw, filter_logits, mark_seen  # noqa: F401 (re-exported)
from grpo.rollout.eos import as_id_tensor, completion_mask_from_ids, ended_with_eos  # noqa: F401 (re-exported)
from grpo.rollout.keyed import row_keys, token_uniforms
from grpo.types import Generation  # noqa: F401  (the output of sample)

#: Decode steps whose uniforms are computed at once (one hash of [n, 32] instead of 32 hashes of [n]).
UNIFORM_BLOCK = 32


def _last_logits(model, **inputs) -> tuple[torch.Tensor, object]:
    """Forward ``inputs`` with the cache on; return the last position's logits and the cache.

    Only the last position goes through the LM head when the model accepts ``logits_to_keep``
    (a peft wrapper forwards it to the model it wraps, whose signature is the one checked).

    Shape:
        inputs["input_ids"]: [n, L] -> logits [n, V]
    """
    if "logits_to_keep" in forward_parameters(model):
        inputs["logits_to_keep"] = 1
    out = model(**inputs, use_cache=True)
    return out.logits[:, -1, :], returned_cache(out)  # [n, V]


def prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, model_inputs: dict | None = None):
    """Run the B prompts once through the model's own forward: next-token logits and its cache.
    `model_inputs`: extra forward inputs of the prompts, [B, ...] each (a VLM's pixel_values); only the
    prefill sees them: the decode steps read the image through the cache.

    Shape:
        prompt_ids, prompt_mask: [B, P] -> logits [B, V], cache of batch B
    """
    return _last_logits(
        model,
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=positions_from_mask(prompt_mask),  # [B, P]
        **cache_inputs(model, None),  # the model builds the cache type it needs (DynamicCache)
        **(model_inputs or {}),
    )


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
        **cache_inputs(model, cache),
    )
    return logits  # [n, V]


@dataclass
class HFDecoding:
    """Decode steps through the model's own forward and ``DynamicCache`` (any causal LM).

    Shape:
        attention_mask: [n, L] long, prompt mask then ones over the tokens fed so far.
    """

    model: object
    cache: object
    attention_mask: torch.Tensor

    def select(self, kept: torch.Tensor) -> None:
        """Keep only rows ``kept``.  Shape: kept [n'] long"""
        self.cache.batch_select_indices(kept)
        self.attention_mask = self.attention_mask[kept]  # [n', L]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row, return next-token logits.  Shape: tokens [n] -> [n, V]"""
        ones = self.attention_mask.new_ones(len(tokens), 1)  # [n, 1]
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=-1)  # [n, L + 1]
        return decode_step(self.model, tokens, self.attention_mask, self.cache)  # [n, V]


@dataclass
class LeanDecoding:
    """Decode steps through :class:`~grpo.modeling.decoder.LeanDecoder` on its static KV cache."""

    decoder: LeanDecoder
    cache: StaticCache

    def select(self, kept: torch.Tensor) -> None:
        """Keep only rows ``kept``.  Shape: kept [n'] long"""
        self.cache.select(kept)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row, return next-token logits.  Shape: tokens [n] -> [n, V]"""
        return self.decoder.step(self.cache, tokens)  # [n, V]


def prefill_shared(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int,
                   max_new_tokens: int, lean: bool = True,
                   model_inputs: dict | None = None) -> tuple[torch.Tensor, HFDecoding | LeanDecoding]:
    """Run the B prompts once and set up decoding of G samples each (row i*G+g).

    The lean decoder is used when ``lean`` and :func:`~grpo.modeling.decoder.lean_decoder` supports
    the model, else the model's own forward with its ``DynamicCache``.

    Shape:
        prompt_ids, prompt_mask: [B, P] -> logits [B*G, V], decoding state of B*G rows
    """
    logits, cache = prefill(model, prompt_ids, prompt_mask, model_inputs)  # [B, V]
    decoder = lean_decoder(model) if lean else None
    if decoder is not None:
        decoding = LeanDecoding(decoder, decoder.start(cache, prompt_mask, num_generations, max_new_tokens))
    else:
        cache.batch_repeat_interleave(num_generations)
        decoding = HFDecoding(model, cache, prompt_mask.repeat_interleave(num_generations, dim=0))
    return logits.repeat_interleave(num_generations, dim=0), decoding  # [N, V]


@contextlib.contextmanager
def sampling_mode(model):
    """The model in eval mode, its frozen linears cast once under autocast (LoRA's base weights); on exit the
    weights are put back, autocast's casts dropped (they would sit beside the next pass's) and the training
    flag restored. Yields the model's device."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with cast_frozen_linears(model, device):
            yield device
    finally:
        torch.clear_autocast_cache()
        model.train(was_training)


def start_rows(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int,
               max_new_tokens: int, seed: int, prompt_index: torch.Tensor | None, lean: bool, device,
               model_inputs: dict | None = None):
    """Prefill the prompts and key the N = B * G rows (:func:`prefill_shared`, grpo/rollout/keyed.py).

    Shape:
        prompt_ids, prompt_mask: [B, P] -> (prompt_ids, prompt_mask on `device`, logits [N, V], decoding state,
        running rows [N], row keys [N])
    """
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device).long()  # [B, P]
    logits, decoding = prefill_shared(model, prompt_ids, prompt_mask, num_generations, max_new_tokens, lean,
                                      {k: v.to(device) for k, v in (model_inputs or {}).items()})
    running = torch.arange(prompt_ids.size(0) * num_generations, device=device)  # [N] row of each running sequence
    if prompt_index is None:
        prompt_index = torch.arange(prompt_ids.size(0), device=device)  # [B]
    keys = row_keys(seed, prompt_index.to(device), num_generations)  # [N] key of each running row
    return prompt_ids, prompt_mask, logits, decoding, running, keys


def step_uniforms(keys: torch.Tensor, step: int, block: torch.Tensor | None, temperature: float):
    """The running rows' uniforms for `step`, drawn UNIFORM_BLOCK steps at a time (None when greedy).
    Shape: keys [n], block [n, K] or None -> (block, uniforms [n] float64 or None)"""
    if temperature > 0 and step % UNIFORM_BLOCK == 0:
        steps_ahead = torch.arange(step, step + UNIFORM_BLOCK, device=keys.device)  # [K]
        block = token_uniforms(keys[:, None], steps_ahead)  # [n, K] float64
    return block, (block[:, step % UNIFORM_BLOCK] if block is not None else None)


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
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    seed: int = 0,
    prompt_index: torch.Tensor | None = None,
    lean: bool = True,
    model_inputs: dict[str, torch.Tensor] | None = None,
) -> Generation:
    """Sample ``num_generations`` completions for each left-padded prompt (see module docstring).

    Randomness is keyed, not drawn from a generator: ``seed`` and ``prompt_index`` (each prompt's
    global position in the run's prompt order, default ``0 .. B-1``) decide every token, so a prompt
    gets the same completions whatever batch, rank or world size samples it (grpo/rollout/keyed.py).

    The model is put in eval mode while sampling and its training flag is restored afterwards.
    ``lean=False`` forces the model's own forward for decoding (the reference the lean decoder of
    :mod:`grpo.modeling.decoder` is tested against); tokens are the same either way.
    ``model_inputs`` (name -> [B, ...], e.g. a VLM's pixel_values) go with the prompts into the prefill and
    come back in the Generation repeated G times.
    ``min_p`` and ``repetition_penalty`` (over each row's prompt and completion tokens) shape the token
    choice as Hugging Face's generate does (grpo/rollout/choice.py); 0 and 1 switch them off.
    ``eos_token_id``: one id or several (grpo.rollout.eos.eos_token_ids: the tokenizer's and the generation
    config's); a row ends at the first of any of them, which stays in its completion mask.

    Shape:
        prompt_ids, prompt_mask: [B, P], prompt_index: [B] long -> Generation with N = B * num_generations rows
    """
    with sampling_mode(model) as device:
        prompt_ids, prompt_mask, logits, decoding, running, keys = start_rows(
            model, prompt_ids, prompt_mask, num_generations, max_new_tokens, seed, prompt_index, lean, device,
            model_inputs)
        n_rows = running.numel()
        eos = as_id_tensor(eos_token_id, device)  # [E] every id that ends a row
        block = None  # [n, UNIFORM_BLOCK] uniforms of the running rows for the current block of steps
        completion_ids = torch.full((n_rows, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(n_rows, max_new_tokens, dtype=torch.float32, device=device)  # [N, max_new]
        steps, scratch = 0, Scratch()
        seen = None  # [n, V] bool: the tokens of each running row so far, for the repetition penalty
        if repetition_penalty != 1.0:
            seen = mark_seen(torch.zeros(n_rows, logits.size(-1), dtype=torch.bool, device=device),  # [N, V]
                             prompt_ids.repeat_interleave(num_generations, 0),
                             prompt_mask.repeat_interleave(num_generations, 0))
        for step in range(max_new_tokens):
            block, uniforms = step_uniforms(keys, step, block, temperature)  # [n]
            tokens, token_logprobs = choose_tokens(logits, temperature, top_k, top_p, uniforms, scratch, min_p, seen,
                                                   repetition_penalty)  # [n], [n]
            completion_ids[running, step] = tokens
            logprobs[running, step] = token_logprobs
            steps = step + 1
            keep = ~torch.isin(tokens, eos)  # [n] one membership test per token, on the device
            live = int(keep.sum()) if steps < max_new_tokens else 0      # one device sync per token
            if live == 0:
                break
            if live < keep.numel():  # drop finished rows from the batch and the cache
                kept = keep.nonzero().squeeze(-1)  # [n']
                decoding.select(kept)
                running, tokens, keys = running[kept], tokens[kept], keys[kept]  # [n'] each
                block = block[kept] if block is not None else None  # [n', K]
                seen = seen[kept] if seen is not None else None  # [n', V]
            if seen is not None:
                mark_seen(seen, tokens)
            logits = decoding.step(tokens)  # [n, V]

    completion_ids = completion_ids[:, :steps]  # [N, T]
    completion_mask = completion_mask_from_ids(completion_ids, eos)  # [N, T]
    return Generation(
        prompt_ids=prompt_ids.repeat_interleave(num_generations, dim=0),  # [N, P]
        prompt_mask=prompt_mask.repeat_interleave(num_generations, dim=0),  # [N, P]
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        sampling_logprobs=logprobs[:, :steps] * completion_mask,  # [N, T]
        truncated=~ended_with_eos(completion_ids, completion_mask, eos),  # [N]
        model_inputs={k: v.to(device).repeat_interleave(num_generations, dim=0)  # [N, ...]
                      for k, v in (model_inputs or {}).items()},
    )
