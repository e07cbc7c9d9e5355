"""The native engine: grpo's own keyed sampler (grpo/rollout/sampler.py, grpo/rollout/multiturn.py) on the live
policy. Every token is a pure function of (seed, prompt index, sample, position): the same completions in any
batch, on any rank, after any resume."""

from __future__ import annotations

import torch

from grpo.rollout.engine import OnLivePolicy, register
from grpo.rollout.multiturn import sample_episodes
from grpo.rollout.params import SamplingParams
from grpo.rollout.sampler import sample
from grpo.types import Generation


class NativeEngine(OnLivePolicy):
    name = "native"

    def __init__(self, model: torch.nn.Module, pad_token_id: int, lean: bool = True):
        self.model, self.pad_token_id, self.lean = model, pad_token_id, lean

    def _common(self, params: SamplingParams) -> dict:
        return dict(num_generations=params.n, max_new_tokens=params.max_tokens, temperature=params.temperature,
                    top_p=params.top_p, top_k=params.top_k, min_p=params.min_p,
                    eos_token_id=list(params.stop_token_ids), pad_token_id=self.pad_token_id, seed=params.seed,
                    lean=self.lean)

    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, *, prompt_index=None,
                 model_inputs=None) -> Generation:
        return sample(self.model, prompt_ids, prompt_mask, repetition_penalty=params.repetition_penalty,
                      prompt_index=prompt_index, model_inputs=model_inputs, **self._common(params))

    def generate_episodes(self, prompt_ids, prompt_mask, driver, params: SamplingParams, *,
                          prompt_index=None) -> Generation:
        return sample_episodes(self.model, prompt_ids, prompt_mask, driver, prompt_index=prompt_index,
                               **self._common(params))


@register("native")
def build(cfg, model, tokenizer, device) -> NativeEngine:
    return NativeEngine(model, tokenizer.pad_token_id)
