"""Row selection and concatenation of Generations (used by the sampling filters).

Prompts stay left-padded and completions right-padded: concatenating batches of different widths
pads prompts on the left and completions on the right.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpo.rollout.sampler import Generation


def select_rows(gen: Generation, index: torch.Tensor) -> Generation:
    """The rows `index` (LongTensor [M]) of a Generation, in that order; width trimmed to the longest."""
    index = index.to(gen.prompt_ids.device)
    mask = gen.completion_mask[index]                                         # [M, T]
    width = int(mask.sum(dim=1).max()) if mask.numel() else 0
    return Generation(prompt_ids=gen.prompt_ids[index], prompt_mask=gen.prompt_mask[index],
                      completion_ids=gen.completion_ids[index, :width], completion_mask=mask[:, :width],
                      sampling_logprobs=gen.sampling_logprobs[index, :width], truncated=gen.truncated[index],
                      action_mask=None if gen.action_mask is None else gen.action_mask[index, :width],
                      model_inputs={k: v[index.to(v.device)] for k, v in gen.model_inputs.items()})


def _pad_to(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    missing = width - t.shape[1]
    return F.pad(t, (missing, 0) if left else (0, missing), value=value) if missing else t


def concat_generations(gens: list[Generation], pad_token_id: int) -> Generation:
    """Stack Generations row-wise: prompts left-padded to the widest, completions right-padded."""
    if len(gens) == 1:
        return gens[0]
    P = max(g.prompt_ids.shape[1] for g in gens)
    T = max(g.completion_ids.shape[1] for g in gens)
    cat = lambda fn: torch.cat([fn(g) for g in gens], dim=0)  # noqa: E731
    return Generation(
        prompt_ids=cat(lambda g: _pad_to(g.prompt_ids, P, pad_token_id, left=True)),
        prompt_mask=cat(lambda g: _pad_to(g.prompt_mask, P, 0, left=True)),
        completion_ids=cat(lambda g: _pad_to(g.completion_ids, T, pad_token_id, left=False)),
        completion_mask=cat(lambda g: _pad_to(g.completion_mask, T, 0, left=False)),
        sampling_logprobs=cat(lambda g: _pad_to(g.sampling_logprobs, T, 0.0, left=False)),
        truncated=cat(lambda g: g.truncated),
        action_mask=None if all(g.action_mask is None for g in gens) else cat(
            lambda g: _pad_to(g.completion_mask if g.action_mask is None else g.action_mask, T, 0, left=False)),
        model_inputs={k: torch.cat([g.model_inputs[k] for g in gens]) for k in gens[0].model_inputs})
