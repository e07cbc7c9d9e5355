"""Held-out evaluation: completions decoded exactly as in training (the rollout sampler and
grpo.training.experience.decode_completions), scored by reward functions. The one evaluator: `grpo eval`,
the Python API, the demo and `grpo sft` all decode through :func:`generate_texts`."""

from __future__ import annotations

from typing import Any

import torch

from grpo.data.prompts import tokenize_prompts
from grpo.rewards import RewardFn, score
from grpo.rewards.text import chat_completions
from grpo.rollout import sample


def _decode(model, tokenizer, chunk: list[dict[str, Any]], start: int, *, max_new_tokens: int, temperature: float,
            seed: int, num_samples: int = 1):
    """Rows `chunk` (starting at row `start` of the evaluation) -> (PromptBatch, Generation, texts)."""
    from grpo.training.experience import decode_completions  # the same decoding as in training

    device = next(model.parameters()).device
    batch = tokenize_prompts(tokenizer, chunk, device)
    gen = sample(model, batch.prompt_ids, batch.prompt_mask, num_generations=num_samples,
                 max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id, seed=seed,
                 prompt_index=torch.arange(start, start + len(chunk), device=device))   # [b] row keys
    return batch, gen, decode_completions(tokenizer, gen)


@torch.no_grad()
def generate_texts(model, tokenizer, rows: list[dict[str, Any]], *, max_new_tokens: int = 48, batch_size: int = 64,
                   temperature: float = 0.0, seed: int = 0, num_samples: int = 1) -> list[str]:
    """`num_samples` completions of every row's ``prompt`` as text (row-major: row 0's samples first),
    greedy at temperature 0, else sampled with keys (seed, row index, sample), independent of `batch_size`."""
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        texts += _decode(model, tokenizer, rows[start:start + batch_size], start, max_new_tokens=max_new_tokens,
                         temperature=temperature, seed=seed, num_samples=num_samples)[2]
    return texts


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict[str, Any]], rewards: list[tuple[str, RewardFn]], *,
             max_new_tokens: int = 48, batch_size: int = 64, temperature: float = 0.0,
             seed: int = 0, timeout_s: float = 0.0, on_error: str = "raise") -> dict[str, float]:
    """Mean of each reward function over `rows` (e.g. {"accuracy": 0.41, "format": 0.99, ...}).

    temperature 0 = greedy decoding (the default), otherwise one sample per prompt, keyed by `seed` and the
    row's index in `rows` (so it does not depend on `batch_size`). `timeout_s` and `on_error` bound and
    contain the reward calls as in training (``reward.timeout_s``, ``reward.reward_errors``).
    """
    from grpo.training.experience import reward_columns

    sums = {name: 0.0 for name, _ in rewards}
    counts = {name: 0 for name, _ in rewards}
    lengths = 0.0
    for start in range(0, len(rows), batch_size):
        batch, gen, texts = _decode(model, tokenizer, rows[start:start + batch_size], start,
                                    max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        scored = score(rewards, None, batch.prompts, chat_completions(batch.prompts, texts),
                       reward_columns(batch.columns, gen), on_error=on_error, timeout_s=timeout_s)
        for k, name in enumerate(scored.names):
            col = scored.per_function[:, k]
            ok = ~torch.isnan(col)
            sums[name] += float(col[ok].sum())
            counts[name] += int(ok.sum())
        lengths += float(gen.completion_mask.sum())
    out = {name: sums[name] / max(counts[name], 1) for name in sums}
    out["completion_length"] = lengths / max(len(rows), 1)
    return out
