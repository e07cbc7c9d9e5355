"""Batched autoregressive sampling of G completions per prompt, with a KV cache.

The prompts of a batch are prefilled once; their last-position logits are repeated G times along
the batch dimension (``repeat_interleave``), so row ``i * G + g`` holds sample ``g`` of prompt ``i``.
Decoding feeds one token per step and drops finished rows from the batch (and from the cache), so
the cost of a step only depends on the rows still running. Llama-family models decode through the
lean decoder of :mod:`grpo.modeling.decoder` (prompt keys/values kept once per prompt, a static cache
for the new tokens, no per-step Hugging Face overhead); other models run their own forward on the
prompts' ``DynamicCache`` repeated G times.

One decode loop (:func:`decode_rows`) serves single-turn completions and multi-turn episodes; what differs is
what ends a row (an :class:`Ends` policy):

    prefill once -> per step: logits -> penalty, filters, keyed draw -> ends.force (an episode's observation
    tokens replace draws) -> write token, log-prob -> ends.settle (which rows go on) -> drop finished rows
    -> next logits
    sample:                       StopTokens, a row ends at its first stop token (tested on the device)
    multiturn.sample_episodes:    DriverEnds, the driver ends turns and episodes (grpo/rollout/multiturn.py)

Randomness contract (what a reference implementation must mirror to reproduce tokens exactly):
token ``t`` of row ``i * G + g`` is drawn by :func:`draw` with the uniform
``token_uniforms(row_keys(seed, prompt_index, G), t)[i * G + g]`` (grpo/rollout/keyed.py): a pure
function of (seed, the prompt's global index, g, t), whatever else is in the batch and whichever
rows have already finished. Greedy decoding (``temperature == 0``) draws nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import torch

from grpo.modeling.precision import cast_frozen_linears
from grpo.modeling.decoder import (LeanDecoder, StaticCache, cache_inputs, forward_parameters, lean_decoder,
                                   positions_from_mask, returned_cache)
from grpo.rollout.choice import Scratch, choose_tokens, draw, filter_logits, mark_seen  # noqa: F401 (re-exported)
from grpo.rollout.eos import as_id_tensor, completion_mask_from_ids, ended_with_eos  # noqa: F401 (re-exported)
from grpo.rollout.keyed import row_keys, token_uniforms
from grpo.rollout.params import Prompts, SamplingParams
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


def prefill_shared(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams,
                   lean: bool = True, model_inputs: dict | None = None) -> tuple[torch.Tensor, HFDecoding | LeanDecoding]:
    """Run the B prompts once and set up decoding of G = ``params.n`` samples each (row i*G+g), at most
    ``params.max_tokens`` new tokens.

    The lean decoder is used when ``lean`` and :func:`~grpo.modeling.decoder.lean_decoder` supports
    the model, else the model's own forward with its ``DynamicCache``.

    Shape:
        prompt_ids, prompt_mask: [B, P] -> logits [B*G, V], decoding state of B*G rows
    """
    num_generations = params.n
    logits, cache = prefill(model, prompt_ids, prompt_mask, model_inputs)  # [B, V]
    decoder = lean_decoder(model) if lean else None
    if decoder is not None:
        decoding = LeanDecoding(decoder, decoder.start(cache, prompt_mask, num_generations, params.max_tokens))
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


def step_uniforms(keys: torch.Tensor, step: int, block: torch.Tensor | None, temperature: float):
    """The running rows' uniforms for `step`, drawn UNIFORM_BLOCK steps at a time (None when greedy).
    Shape: keys [n], block [n, K] or None -> (block, uniforms [n] float64 or None)"""
    if temperature > 0 and step % UNIFORM_BLOCK == 0:
        steps_ahead = torch.arange(step, step + UNIFORM_BLOCK, device=keys.device)  # [K]
        block = token_uniforms(keys[:, None], steps_ahead)  # [n, K] float64
    return block, (block[:, step % UNIFORM_BLOCK] if block is not None else None)


class Ends(Protocol):
    """What ends a row (and what, if anything, is fed to it instead of a draw): the one policy the decode loop
    asks. :class:`StopTokens` for single-turn completions, grpo.rollout.multiturn.DriverEnds for episodes."""

    forces: bool  # True: force() may replace draws (observation tokens), the loop keeps an action mask

    def start(self, n_rows: int, device) -> None: ...

    def force(self, running: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor | None:
        """Replace the draws of rows fed a token this step (in place); 1 where the model's draw stands.  [n]"""

    def settle(self, running: torch.Tensor, tokens: torch.Tensor, last: bool) -> tuple[bool, torch.Tensor | None]:
        """After the step's tokens: (every row over, positions of the rows that go on; None = all of them)."""


class StopTokens:
    """Single-turn rows: a row ends at its first stop token, tested on the device (one host sync per step, none at
    the last)."""

    forces = False

    def __init__(self, stop_token_ids):
        self.stop_token_ids = stop_token_ids

    def start(self, n_rows: int, device) -> None:
        self.eos = as_id_tensor(self.stop_token_ids, device)  # [E] every id that ends a row

    def force(self, running, tokens, logprobs) -> None:
        return None

    def settle(self, running, tokens, last: bool):
        keep = ~torch.isin(tokens, self.eos)  # [n] one membership test per token, on the device
        live = int(keep.sum()) if not last else 0      # one device sync per token
        if live == 0:
            return True, None
        return False, (keep.nonzero().squeeze(-1) if live < keep.numel() else None)  # [n'] or all


@dataclass
class Decoded:
    """What the decode loop wrote, N = B * G rows, T = the steps taken.

    Shape:
        prompt_ids, prompt_mask: [B, P] on the model's device; completion_ids [N, T] long (pad where nothing was
        written), logprobs [N, T] float32 (of each written token), action [N, T] long (1 on sampled tokens) or None
        when the rows' ends force nothing.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    logprobs: torch.Tensor
    action: torch.Tensor | None


@torch.no_grad()
def decode_rows(model, prompts: Prompts, params: SamplingParams, ends: Ends, *, pad_token_id: int,
                lean: bool = True) -> Decoded:
    """The one decode loop of the native engine: prefill once, then per step, for every running row,
    logits -> keyed draw (choose_tokens: penalty, filters, inverse CDF) -> `ends.force` (a fed token replaces the
    draw) -> write token and log-prob -> `ends.settle` (drop finished rows from the batch and the cache) -> next
    logits. Randomness as the module docstring says: step t of row i*G+g draws with its keyed uniform whatever
    else happens in the batch (a forced token still uses up its step's uniform).

    Shape:
        prompts.ids, prompts.mask: [B, P] -> Decoded of N = B * params.n rows
    """
    G, max_tokens, temperature = params.n, params.max_tokens, params.temperature
    with sampling_mode(model) as device:
        prompt_ids, prompt_mask = prompts.ids.to(device), prompts.mask.to(device).long()  # [B, P]
        logits, decoding = prefill_shared(model, prompt_ids, prompt_mask, params, lean,
                                          {k: v.to(device) for k, v in prompts.model_inputs.items()})  # [N, V]
        n_rows = prompt_ids.size(0) * G
        running = torch.arange(n_rows, device=device)  # [N] row of each running sequence
        index = torch.arange(prompt_ids.size(0), device=device) if prompts.index is None else prompts.index  # [B]
        keys = row_keys(params.seed, index.to(device), G)  # [N] key of each running row
        ends.start(n_rows, device)
        completion_ids = torch.full((n_rows, max_tokens), pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(n_rows, max_tokens, dtype=torch.float32, device=device)  # [N, max_tokens]
        action = torch.zeros(n_rows, max_tokens, dtype=torch.long, device=device) if ends.forces else None
        block = None  # [n, UNIFORM_BLOCK] uniforms of the running rows for the current block of steps
        steps, scratch = 0, Scratch()
        seen = None  # [n, V] bool: the tokens of each running row so far, for the repetition penalty
        if params.repetition_penalty != 1.0:
            seen = mark_seen(torch.zeros(n_rows, logits.size(-1), dtype=torch.bool, device=device),  # [N, V]
                             prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0))
        for step in range(max_tokens):
            block, uniforms = step_uniforms(keys, step, block, temperature)  # [n]
            tokens, token_logprobs = choose_tokens(logits, temperature, params.top_k, params.top_p, uniforms, scratch,
                                                   params.min_p, seen, params.repetition_penalty)  # [n], [n]
            is_action = ends.force(running, tokens, token_logprobs)  # [n] or None
            completion_ids[running, step] = tokens
            logprobs[running, step] = token_logprobs
            if action is not None:
                action[running, step] = is_action
            steps = step + 1
            over, kept = ends.settle(running, tokens, last=steps == max_tokens)
            if over:
                break
            if kept is not None:  # drop finished rows from the batch and the cache
                decoding.select(kept)
                running, tokens, keys = running[kept], tokens[kept], keys[kept]  # [n'] each
                block = block[kept] if block is not None else None  # [n', K]
                seen = seen[kept] if seen is not None else None  # [n', V]
            if seen is not None:
                mark_seen(seen, tokens)
            logits = decoding.step(tokens)  # [n, V]
    return Decoded(prompt_ids, prompt_mask, completion_ids[:, :steps], logprobs[:, :steps],
                   None if action is None else action[:, :steps])


def sample(model, prompts: Prompts, params: SamplingParams, *, pad_token_id: int, lean: bool = True) -> Generation:
    """Sample ``params.n`` completions for each left-padded prompt (see module docstring): the decode loop
    (:func:`decode_rows`) with rows that end at a stop token.

    Randomness is keyed, not drawn from a generator: ``params.seed`` and ``prompts.index`` (each prompt's
    global position in the run's prompt order, default ``0 .. B-1``) decide every token, so a prompt
    gets the same completions whatever batch, rank or world size samples it (grpo/rollout/keyed.py).

    The model is put in eval mode while sampling and its training flag is restored afterwards.
    ``lean=False`` forces the model's own forward for decoding (the reference the lean decoder of
    :mod:`grpo.modeling.decoder` is tested against); tokens are the same either way.
    ``prompts.model_inputs`` (name -> [B, ...], e.g. a VLM's pixel_values) go with the prompts into the prefill and
    come back in the Generation repeated G times.
    ``min_p`` and ``repetition_penalty`` (over each row's prompt and completion tokens) shape the token
    choice as Hugging Face's generate does (grpo/rollout/choice.py); 0 and 1 switch them off.
    ``params.stop_token_ids``: the ids that end a row (grpo.rollout.eos.eos_token_ids: the tokenizer's and the
    generation config's); a row ends at the first of any of them, which stays in its completion mask.

    Shape:
        prompts.ids, prompts.mask: [B, P], prompts.index: [B] long -> Generation with N = B * params.n rows
    """
    G = params.n
    out = decode_rows(model, prompts, params, StopTokens(params.stop_token_ids), pad_token_id=pad_token_id, lean=lean)
    device = out.prompt_ids.device
    eos = as_id_tensor(params.stop_token_ids, device)  # [E]
    completion_mask = completion_mask_from_ids(out.completion_ids, eos)  # [N, T]
    return Generation(
        prompt_ids=out.prompt_ids.repeat_interleave(G, dim=0),  # [N, P]
        prompt_mask=out.prompt_mask.repeat_interleave(G, dim=0),  # [N, P]
        completion_ids=out.completion_ids,
        completion_mask=completion_mask,
        sampling_logprobs=out.logprobs * completion_mask,  # [N, T]
        truncated=~ended_with_eos(out.completion_ids, completion_mask, eos),  # [N]
        model_inputs={k: v.to(device).repeat_interleave(G, dim=0)  # [N, ...]
                      for k, v in prompts.model_inputs.items()},
    )
