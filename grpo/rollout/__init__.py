"""Rollout: sampling G completions per prompt from a causal LM."""

from grpo.rollout.eos import completion_text, eos_token_ids
from grpo.rollout.params import Prompts, SamplingParams
from grpo.rollout.sampler import Generation, completion_mask_from_ids, filter_logits, sample

__all__ = ["Generation", "Prompts", "SamplingParams", "completion_mask_from_ids", "completion_text", "eos_token_ids",
           "filter_logits", "sample"]
