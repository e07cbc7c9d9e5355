"""Evaluation of multi-turn episodes (docs/agents.md): each held-out row played once in a fresh environment,
greedy by default, scored by the run's reward functions on the episode's messages. The play and the summary
of grpo.training.evaluate.evaluate, the one evaluation."""

from __future__ import annotations

from typing import Any

import torch

from grpo.config import Config
from grpo.data.prompts import tokenize_prompts
from grpo.envs.episodes import play_episodes
from grpo.rollout.eos import eos_token_ids
from grpo.rollout.engines.native import NativeEngine
from grpo.rollout.params import Prompts, rollout_params
from grpo.training.evaluate import Played, evaluate


class Episodes:
    """The episode play: each row of a chunk played once in a fresh environment of `env` (rollout settings of
    `cfg`, the temperature of the evaluation); the rewards get the episode's messages and reward.weights."""

    def __init__(self, env, cfg: Config) -> None:
        self.env, self.cfg = env, cfg

    def __call__(self, model, tokenizer, rows: list[dict[str, Any]], start: int, *, temperature: float,
                 **_: Any) -> Played:
        cfg = self.cfg
        device = next(model.parameters()).device
        params = rollout_params(cfg.rollout, eos_token_ids(tokenizer, model), cfg.train.seed, n=1).with_(
            temperature=temperature)                                   # the evaluation's (greedy by default)
        batch = tokenize_prompts(tokenizer, rows, device)
        index = torch.arange(start, start + len(rows), dtype=torch.long, device=device)          # [B] global rows
        eps = play_episodes(NativeEngine(model, tokenizer.pad_token_id), tokenizer, rows,
                            Prompts(batch.prompt_ids, batch.prompt_mask, index), self.env, params, cfg.rollout)
        totals = {"tool_use": eps.metrics["tools/use_rate"] * len(rows),
                  "tool_calls": eps.metrics["tools/calls_per_episode"] * len(rows),
                  "tool_errors": eps.metrics["tools/errors"],
                  "episode_length": float(eps.gen.completion_mask.sum())}
        return Played(start, rows, batch.prompts, eps.messages, {**batch.columns, **eps.columns}, eps.gen,
                      weights=cfg.reward.weights, totals=totals)


class EpisodeMeans:
    """Per row: every reward function (a missing score counts 0), tool_use (the share of episodes that called a
    tool), tool_calls and tool_errors per episode, episode_length in tokens (observations included)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.rows = 0

    def add(self, played: Played, scored) -> None:
        values = {name: scored.per_function[:, j].nan_to_num(0.0).sum().item() for j, name in enumerate(scored.names if scored is not None else [])}
        for k, v in {**values, **played.totals}.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        self.rows += len(played.rows)

    def result(self, names: list[str]) -> dict[str, float]:
        return {k: v / max(self.rows, 1) for k, v in self.sums.items()}


@torch.no_grad()
def evaluate_episodes(model, tokenizer, rows: list[dict[str, Any]], rewards: list, env, cfg: Config,
                      temperature: float = 0.0, batch_size: int = 64) -> dict[str, float]:
    """Mean of every reward function over `rows`, the share of episodes that called a tool (tool_use), tool
    calls and errors per episode, and the mean episode length in tokens (observations included)."""
    return evaluate(model, tokenizer, rows, rewards, batch_size=batch_size, temperature=temperature,
                    timeout_s=cfg.reward.timeout_s, play=Episodes(env, cfg), summary=EpisodeMeans())
