"""One step's multi-turn episodes: G environments per prompt, played by grpo/rollout/multiturn.py through an
:class:`~grpo.envs.agent.EpisodeDriver`; what the experience stage needs back (docs/agents.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpo.config import RolloutConfig
from grpo.data.prompts import left_pad
from grpo.envs.agent import EpisodeDriver
from grpo.envs.environment import EnvFactory, resolve
from grpo.envs.parsers import load_parser
from grpo.rollout.params import Prompts, SamplingParams
from grpo.types import Generation


@dataclass
class Episodes:
    gen: Generation                      # completion = model and observation tokens; action_mask marks the model's
    messages: list[list[dict]]           # [N] each episode's assistant / tool messages (what rewards receive)
    columns: dict[str, list] = field(default_factory=dict)   # [N] extra reward columns: turn_rewards
    metrics: dict[str, float] = field(default_factory=dict)   # tools/*, env/*


def play_episodes(engine, tokenizer, rows: list[dict[str, Any]], prompts: Prompts, factory: EnvFactory,
                  params: SamplingParams, ro: RolloutConfig) -> Episodes:
    """k = ``params.n`` episodes of each row (row i*k+j: episode j of prompt i), each in a fresh environment,
    played by `engine` (grpo/rollout/engine.py) with the tools and observation settings of `ro` (``cfg.rollout``).

    An environment whose reset() returns text replaces the prompt of its group with it (the first
    episode's text counts: a group shares its prompt); None keeps the row's prompt.
    ``params.stop_token_ids`` end an episode (grpo.rollout.eos.eos_token_ids) and the driver's turns too.
    Shape: prompts.ids, prompts.mask [B, P], prompts.index [B] -> Episodes of N = B * k rows."""
    if params.repetition_penalty != 1.0:    # the env object may come from Trainer(env=...), past the config check
        raise ValueError("rollout.repetition_penalty applies to single-turn rollouts; with an environment leave it "
                         "at 1.0")
    k, device = params.n, prompts.ids.device
    envs = [factory.make() for _ in range(len(rows) * k)]
    firsts = [resolve(env.reset(rows[i // k])) for i, env in enumerate(envs)]
    replaced = [firsts[i * k] for i in range(len(rows))]
    prompt_ids, prompt_mask = prompts.ids, prompts.mask
    if any(isinstance(p, str) for p in replaced):
        seqs = [tokenizer(p)["input_ids"] if isinstance(p, str) else ids[m.bool()].tolist()
                for p, ids, m in zip(replaced, prompt_ids, prompt_mask)]
        prompt_ids, prompt_mask = left_pad(seqs, tokenizer.pad_token_id)
    driver = EpisodeDriver(tokenizer, envs, load_parser(ro.tool_parser), max_turns=ro.max_turns,
                           observation_format=ro.observation_format, timeout_s=ro.tool_timeout_s,
                           max_chars=ro.max_observation_chars, eos_token_ids=params.stop_token_ids)
    gen = engine.generate_episodes(prompt_ids.to(device), prompt_mask.to(device), driver, params,
                                   prompt_index=None if prompts.index is None else prompts.index.to(device))
    return Episodes(gen, driver.messages, {"turn_rewards": driver.turn_rewards}, driver.metrics())


def turn_ids(action_mask: torch.Tensor) -> torch.Tensor:
    """The turn of each model token (0, 1, ...: a turn ends where an observation begins); -1 on observation
    tokens and padding. Turn rewards (env ``info["reward"]``) are step rewards over these steps
    (grpo.algorithms.shaping.process_advantages, DeepSeekMath's process supervision).
    Shape: [N, T] long -> [N, T] long, on the host."""
    act = action_mask.detach().cpu().long()                                   # [N, T]
    starts = torch.zeros_like(act)
    starts[:, 1:] = ((act[:, 1:] == 1) & (act[:, :-1] == 0)).long()           # a model token after an observation
    turn = starts.cumsum(dim=1)                                               # [N, T]
    return torch.where(act == 1, turn, torch.full_like(turn, -1))
