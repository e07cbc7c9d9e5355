"""The transformers engine: the policy's own ``model.generate`` (the baseline TRL users know), on the live policy.

Sampling uses torch's global generator, seeded per call from (seed, the batch's first prompt index) inside a
forked RNG state, so the run's own random streams are untouched and a batch repeats under the same seed; unlike
the native engine a prompt's samples depend on the batch it is in. Log-probs are those of the processed
distribution the token was drawn from (``compute_transition_scores`` over the warped scores), as the native
sampler's. Multi-turn episodes go turn by turn (grpo/rollout/engines/turns.py).
"""

from __future__ import annotations

import torch

from grpo.rollout.engine import OnLivePolicy, register
from grpo.rollout.engines.turns import play_turns
from grpo.rollout.eos import completion_mask_from_ids, ended_with_eos
from grpo.rollout.params import Prompts, SamplingParams, prompt_seeds
from grpo.rollout.sampler import sampling_mode
from grpo.types import Generation


class TransformersEngine(OnLivePolicy):
    name = "transformers"

    def __init__(self, model: torch.nn.Module, pad_token_id: int):
        self.model, self.pad_token_id = model, pad_token_id

    def _options(self, params: SamplingParams) -> dict:
        greedy = params.temperature == 0
        options = dict(do_sample=not greedy, max_new_tokens=params.max_tokens, num_return_sequences=params.n,
                       eos_token_id=list(params.stop_token_ids), pad_token_id=self.pad_token_id,
                       output_scores=True, return_dict_in_generate=True, use_cache=True,
                       repetition_penalty=params.repetition_penalty)
        if not greedy:
            options.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None,
                           min_p=params.min_p or None)
        else:
            options.update(temperature=None, top_p=None, top_k=None)
        return options

    @torch.no_grad()
    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, *, prompt_index=None,
                 model_inputs=None) -> Generation:
        index = torch.arange(prompt_ids.size(0), device="cpu") if prompt_index is None else prompt_index
        with sampling_mode(self.model) as device, torch.random.fork_rng(devices=[]):
            torch.manual_seed(prompt_seeds(params.seed, index[:1])[0])
            prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device).long()     # [B, P]
            extra = {k: v.to(device) for k, v in (model_inputs or {}).items()}
            out = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **extra,
                                      **self._options(params))
            P = prompt_ids.size(1)
            completion_ids = out.sequences[:, P:]                                                 # [N, T]
            scores = torch.stack(out.scores, dim=1).float().log_softmax(dim=-1)                   # [N, T, V]
            logprobs = scores.gather(-1, completion_ids[..., None]).squeeze(-1)                   # [N, T]
        stop = list(params.stop_token_ids)
        mask = completion_mask_from_ids(completion_ids, stop)                                     # [N, T]
        n = params.n
        return Generation(
            prompt_ids=prompt_ids.repeat_interleave(n, dim=0), prompt_mask=prompt_mask.repeat_interleave(n, dim=0),
            completion_ids=torch.where(mask.bool(), completion_ids, torch.full_like(completion_ids, self.pad_token_id)),
            completion_mask=mask,
            sampling_logprobs=torch.nan_to_num(logprobs, neginf=0.0) * mask if params.temperature > 0
            else torch.zeros_like(logprobs),
            truncated=~ended_with_eos(completion_ids, mask, stop),
            model_inputs={k: v.repeat_interleave(n, dim=0) for k, v in extra.items()})

    def generate_episodes(self, prompt_ids, prompt_mask, driver, params: SamplingParams, *,
                          prompt_index=None) -> Generation:
        return play_turns(self, Prompts(prompt_ids, prompt_mask, prompt_index), driver, params, self.pad_token_id)


@register("transformers")
def build(cfg, model, tokenizer, device) -> TransformersEngine:
    return TransformersEngine(model, tokenizer.pad_token_id)
