"""Where a completion ends and the text it reads as, as TRL's GRPOTrainer decides both.

    EOS ids  = the tokenizer's eos + every id of ``model.generation_config.eos_token_id`` (int or list),
               deduplicated, order kept: a chat model's end-of-turn token (Llama-3-Instruct's <|eot_id|>,
               Qwen2.5-Instruct's <|im_end|>, Gemma-it's <end_of_turn>) ends a completion too
    mask     = 1 up to and including the first of them, 0 after (the ending token is trained on)
    text     = the masked ids decoded with ``skip_special_tokens=True``: what reward functions read

TRL 1.16: trainer/grpo_trainer.py (eos_token_ids at ~409, the mask at ~1881, the text at ~2244).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch


def eos_token_ids(tokenizer, model=None) -> tuple[int, ...]:
    """Every id that ends a completion: ``tokenizer.eos_token_id`` first, then the ids of the model's
    ``generation_config.eos_token_id`` (an int or a list), without repeats or Nones.

    A wrapper (peft, DDP's ``.module``) is looked through for its generation config."""
    config = getattr(model, "generation_config", None)
    if config is None and model is not None:
        config = getattr(getattr(model, "module", None), "generation_config", None)
    listed = getattr(config, "eos_token_id", None)
    listed = [listed] if isinstance(listed, int) else list(listed or [])
    ids = [tokenizer.eos_token_id, *listed]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def as_id_list(eos_token_id: int | Sequence[int] | torch.Tensor) -> list[int]:
    """One id or several as a list of ints (a host-side loop's membership test)."""
    if isinstance(eos_token_id, torch.Tensor):
        return [int(i) for i in eos_token_id.reshape(-1).tolist()]
    return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(i) for i in eos_token_id]


def as_id_tensor(eos_token_id: int | Sequence[int] | torch.Tensor, device) -> torch.Tensor:
    """One id or several as a small long tensor on `device` (for ``torch.isin``).  Shape: -> [E]"""
    return torch.as_tensor(eos_token_id, dtype=torch.long, device=device).reshape(-1)  # [E]


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_id: int | Sequence[int] | torch.Tensor
                             ) -> torch.Tensor:
    """1 up to and including the first EOS (any of `eos_token_id`) of each row, 0 after (works when pad is an EOS).

    Shape:
        completion_ids: [N, T] -> [N, T] long
    """
    is_eos = torch.isin(completion_ids, as_id_tensor(eos_token_id, completion_ids.device)).long()  # [N, T]
    eos_seen_before = is_eos.cumsum(dim=-1) - is_eos  # [N, T]
    return (eos_seen_before == 0).long()  # [N, T]


def ended_with_eos(completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                   eos_token_id: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
    """True for rows whose kept tokens contain an EOS (the rest were cut by the token cap: truncated).

    Shape:
        completion_ids, completion_mask: [N, T] -> [N] bool
    """
    is_eos = torch.isin(completion_ids, as_id_tensor(eos_token_id, completion_ids.device))  # [N, T]
    return (is_eos & completion_mask.bool()).any(dim=-1)  # [N]


def completion_text(tokenizer, ids: Sequence[int], keep: Iterable[int] = ()) -> str:
    """The text of one completion's token ids as TRL hands it to reward functions: special tokens (EOS,
    end-of-turn, unk, ...) dropped. Ids in `keep` stay as their text even when special (a tool-call tag a
    parser reads): the ids are decoded in runs split at them."""
    keep = set(keep)
    if not keep.intersection(ids):
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    parts, run = [], []
    for t in ids:
        if t in keep:
            parts += [tokenizer.decode(run, skip_special_tokens=True), tokenizer.decode([t])]
            run = []
        else:
            run.append(t)
    return "".join(parts + [tokenizer.decode(run, skip_special_tokens=True)])
