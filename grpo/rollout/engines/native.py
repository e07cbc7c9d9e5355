"""The native engine: grpo's own keyed sampler on the live policy: one decode loop (grpo/rollout/sampler.py
``decode_rows``) whose rows end at a stop token (``sample``) or as an episode's driver decides
(grpo/rollout/multiturn.py ``sample_episodes``). Every token is a pure function of (seed, prompt index, sample,
position): the same completions in any batch, on any rank, after any resume."""

from __future__ import annotations

import torch

from grpo.rollout.engine import OnLivePolicy, register
from grpo.rollout.multiturn import sample_episodes
from grpo.rollout.params import Prompts, SamplingParams
from grpo.rollout.sampler import sample
from grpo.types import Generation


class NativeEngine(OnLivePolicy):
    name = "native"

    def __init__(self, model: torch.nn.Module, pad_token_id: int, lean: bool = True):
        self.model, self.pad_token_id, self.lean = model, pad_token_id, lean

    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, *, prompt_index=None,
                 model_inputs=None) -> Generation:
        return sample(self.model, Prompts(prompt_ids, prompt_mask, prompt_index, model_inputs or {}), params,
                      pad_token_id=self.pad_token_id, lean=self.lean)

    def generate_episodes(self, prompt_ids, prompt_mask, driver, params: SamplingParams, *,
                          prompt_index=None) -> Generation:
        return sample_episodes(self.model, Prompts(prompt_ids, prompt_mask, prompt_index), params, driver,
                               pad_token_id=self.pad_token_id, lean=self.lean)


@register("native")
def build(cfg, model, tokenizer, device) -> NativeEngine:
    return NativeEngine(model, tokenizer.pad_token_id)
