"""Evaluation of multi-turn episodes (docs/agents.md): each held-out row played once in a fresh environment,
greedy by default, scored by the run's reward functions on the episode's messages."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from grpo.config import Config
from grpo.data.prompts import tokenize_prompts
from grpo.envs.episodes import play_episodes
from grpo.rewards import score


@torch.no_grad()
def evaluate_episodes(model, tokenizer, rows: list[dict[str, Any]], rewards: list, env, cfg: Config,
                      temperature: float = 0.0, batch_size: int = 64) -> dict[str, float]:
    """Mean of every reward function over `rows`, the share of episodes that called a tool (tool_use), tool
    calls and errors per episode, and the mean episode length in tokens (observations included)."""
    device = next(model.parameters()).device
    greedy = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, temperature=temperature))
    sums: dict[str, float] = {}
    n = 0
    for start in range(0, len(rows), batch_size):
        part = rows[start:start + batch_size]
        batch = tokenize_prompts(tokenizer, part, device)
        eps = play_episodes(model, tokenizer, part, batch.prompt_ids, batch.prompt_mask, env, greedy, 1,
                            list(range(start, start + len(part))), device)
        scored = score(rewards, cfg.reward.weights, batch.prompts, eps.messages,
                       {**batch.columns, **eps.columns}, timeout_s=cfg.reward.timeout_s)
        values = {name: scored.per_function[:, j].nan_to_num(0.0).sum().item() for j, name in enumerate(scored.names)}
        values["tool_use"] = eps.metrics["tools/use_rate"] * len(part)
        values["tool_calls"] = eps.metrics["tools/calls_per_episode"] * len(part)
        values["tool_errors"] = eps.metrics["tools/errors"]
        values["episode_length"] = float(eps.gen.completion_mask.sum())
        for k, v in values.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += len(part)
    return {k: v / max(n, 1) for k, v in sums.items()}
