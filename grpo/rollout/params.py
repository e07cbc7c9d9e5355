"""One sampling request, shaped like vLLM's ``SamplingParams``: what every engine takes (grpo/rollout/engine.py).

Field names and meanings follow vLLM so the value maps onto ``vllm.SamplingParams`` field for field; the
keyed seed is grpo's: an engine derives one seed per prompt from ``seed`` and the prompt's global index
(:func:`prompt_seeds`), so a prompt group gets the same completions in any batch and on any rank where
the engine's own sampling is batch-invariant (the native engine always is: grpo/rollout/keyed.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from grpo.rollout.keyed import child_key, row_keys


@dataclass(frozen=True)
class SamplingParams:
    """What to sample for each prompt (vLLM's names).

    n:                  completions per prompt (G).
    temperature:        0 = greedy.
    top_p, top_k, min_p: nucleus, top-k (0 = off; vLLM spells off -1 or 0), min-p (0 = off).
    repetition_penalty: Hugging Face's / vLLM's (1 = off).
    max_tokens:         the longest completion; a completion ends earlier at any id of ``stop_token_ids``.
    stop_token_ids:     ids that end a completion and stay in it (the tokenizer's and generation config's EOS).
    seed:               the run seed; per-prompt seeds derive from it (:func:`prompt_seeds`).
    logprobs:           0 = return the sampled token's log-prob under the distribution it was drawn from
                        (after temperature and the filters: vLLM's processed log-probs); None = do not.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    logprobs: int | None = 0

    def with_(self, **changes) -> "SamplingParams":
        return replace(self, **changes)


@dataclass(frozen=True)
class Prompts:
    """The left-padded prompts of one request and the keys of their sampling.

    ids, mask:    [B, P] long, left-padded, mask 1 on real tokens.
    index:        [B] long, each prompt's global position in the run's prompt order: with the seed it keys the
                  prompt's draws (grpo/rollout/keyed.py); None = 0 .. B-1.
    model_inputs: name -> [B, ...], extra forward inputs of the prompts (a VLM's pixel_values).
    """

    ids: torch.Tensor
    mask: torch.Tensor
    index: torch.Tensor | None = None
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)


def rollout_params(ro, stop_token_ids: Sequence[int], seed: int, n: int | None = None) -> SamplingParams:
    """The rollout section of the config (``cfg.rollout``) as one request's parameters."""
    return SamplingParams(n=ro.num_generations if n is None else n, temperature=ro.temperature, top_p=ro.top_p,
                          top_k=ro.top_k, min_p=ro.min_p, repetition_penalty=ro.repetition_penalty,
                          max_tokens=ro.max_new_tokens, stop_token_ids=tuple(int(i) for i in stop_token_ids),
                          seed=seed)


def prompt_seeds(seed: int, prompt_index: torch.Tensor, salt: int = 0) -> list[int]:
    """One 31-bit seed per prompt: the keyed stream of (seed, the prompt's global index) (grpo/rollout/keyed.py),
    then child `salt` (a multi-turn episode's turn). A pure function of its inputs: what a seeded engine
    (vLLM's per-request ``seed``) needs to repeat a prompt's group in any batch.

    Shape: prompt_index [B] long -> B ints in [0, 2**31)"""
    keys = row_keys(seed, prompt_index.detach().cpu().long(), 1)            # [B] int64
    if salt:
        keys = child_key(keys, salt)
    return [int(k) & 0x7FFFFFFF for k in keys.tolist()]
