"""Multi-turn rollouts: the model generates, a driver (tools, an environment) answers with observation
tokens, the model continues, in one decode loop over all G x B episodes: the loop of single-turn sampling
(grpo.rollout.sampler.decode_rows) with :class:`DriverEnds` deciding where rows end.

    prompt -> prefill once -> per step, each running row either
        samples its next token (a model token: action mask 1), or
        is fed the next token of its pending observation (a forced token: action mask 0)
    -> after each sampled token the driver may end the turn (a tool call closed: observation tokens to
       feed, or the episode is over); an EOS (any id of `params.stop_token_ids`) ends an episode;
       `params.max_tokens` caps all tokens of it

The KV cache is the one of :func:`grpo.rollout.sampler.prefill_shared` for the whole episode: an
observation is fed token by token through the same cache as the model's own tokens, so no turn
re-reads its context and the tokens trained on are exactly the tokens the model saw (no
re-tokenisation). Randomness is keyed as in :func:`grpo.rollout.sampler.sample` (a forced token still
uses up its step's uniform, so a row's draws depend only on its key and position).

The driver (grpo/envs/agent.py builds one) is any object with
``after_token(row: int, token: int) -> tuple[list[int], bool]``: the observation tokens to feed next
(empty: keep generating) and whether the episode is over, and ``finish(row: int, ended_by_eos: bool)``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from grpo.rollout.params import Prompts, SamplingParams
from grpo.rollout.sampler import decode_rows
from grpo.types import Generation


class Driver(Protocol):
    def after_token(self, row: int, token: int) -> tuple[list[int], bool]: ...

    def finish(self, row: int, ended_by_eos: bool) -> None: ...


class DriverEnds:
    """Episode rows (grpo.rollout.sampler.Ends): a row's pending observation tokens replace its draws, the driver
    sees every sampled token (on the host: one sync per step) and ends a turn or the episode; a stop token ends
    the episode."""

    forces = True

    def __init__(self, driver: Driver, stop_token_ids):
        self.driver = driver
        self.eos = set(stop_token_ids)             # the ids that end an episode, for the host loop
        self.pending: dict[int, list[int]] = {}     # row -> observation tokens still to feed

    def start(self, n_rows: int, device) -> None:
        self.ended_by_eos = [False] * n_rows       # host-side: settle() syncs once per token

    def force(self, running: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
        """Observation tokens replace the draw, log-prob 0.  Shape: running, tokens, logprobs [n] -> [n] long"""
        self.rows = running.tolist()
        self.forced = [i for i, r in enumerate(self.rows) if self.pending.get(r)]
        is_action = torch.ones_like(tokens)
        if self.forced:
            at = torch.tensor(self.forced, dtype=torch.long, device=tokens.device)
            tokens[at] = torch.tensor([self.pending[self.rows[i]].pop(0) for i in self.forced], dtype=torch.long,
                                      device=tokens.device)
            logprobs[at] = 0.0
            is_action[at] = 0
        return is_action

    def settle(self, running: torch.Tensor, tokens: torch.Tensor, last: bool):
        rows, driver = self.rows, self.driver
        keep = [True] * len(rows)
        was_forced = set(self.forced)
        for i, (r, t) in enumerate(zip(rows, tokens.tolist())):
            if i in was_forced:
                continue
            if t in self.eos:
                keep[i], self.ended_by_eos[r] = False, True
                driver.finish(r, True)
                continue
            obs, done = driver.after_token(r, t)
            if done:
                keep[i] = False
                driver.finish(r, False)
            elif obs:
                self.pending[r] = list(obs)
        if last or not any(keep):
            for i, r in enumerate(rows):
                if keep[i]:
                    driver.finish(r, False)                # cut by the token cap
            return True, None
        if all(keep):
            return False, None
        return False, torch.tensor([i for i, k in enumerate(keep) if k], dtype=torch.long, device=tokens.device)


def sample_episodes(model, prompts: Prompts, params: SamplingParams, driver: Driver, *, pad_token_id: int,
                    lean: bool = True) -> Generation:
    """G = ``params.n`` episodes per left-padded prompt; row ``i * G + g`` is episode ``g`` of prompt ``i``: the
    decode loop of grpo/rollout/sampler.py with rows whose ends the driver decides (:class:`DriverEnds`).

    Returns a Generation whose completion holds every token after the prompt (the model's and the
    observations'), ``completion_mask`` 1 on all of them (they are context), ``action_mask`` 1 on the
    model's tokens only (what the loss and the KL see), ``sampling_logprobs`` 0 on observation tokens
    and ``truncated`` True for an episode that hit ``params.max_tokens`` or was ended by the driver
    without a stop token. ``params.stop_token_ids``: any of them ends an episode (grpo.rollout.eos.eos_token_ids).

    Shape:
        prompts.ids, prompts.mask: [B, P], prompts.index: [B] -> Generation with N = B * params.n rows
    """
    G, ends = params.n, DriverEnds(driver, params.stop_token_ids)
    out = decode_rows(model, prompts, params, ends, pad_token_id=pad_token_id, lean=lean)
    completion_ids, action = out.completion_ids, out.action                 # [N, T]
    written = written_mask(action)                                           # [N, T]
    device = out.prompt_ids.device
    return Generation(
        prompt_ids=out.prompt_ids.repeat_interleave(G, dim=0),  # [N, P]
        prompt_mask=out.prompt_mask.repeat_interleave(G, dim=0),  # [N, P]
        completion_ids=torch.where(written.bool(), completion_ids, torch.full_like(completion_ids, pad_token_id)),
        completion_mask=written,
        sampling_logprobs=out.logprobs * action,  # [N, T]
        truncated=~torch.tensor(ends.ended_by_eos, dtype=torch.bool, device=device),  # [N]
        action_mask=action * written,  # [N, T]
    )


def written_mask(action: torch.Tensor) -> torch.Tensor:
    """1 on each row's tokens up to and including its last model token (an episode always ends on one: its
    EOS, the token that ended it, or the last before the cap; observation tokens fed after the cap are
    dropped, nothing follows them).  Shape: [N, T] -> [N, T] long"""
    T = action.size(1)
    last = T - action.flip(1).argmax(dim=1)                                   # [N] index after the last 1
    length = torch.where(action.any(dim=1), last, torch.zeros_like(last))     # [N]
    return (torch.arange(T, device=action.device)[None, :] < length[:, None]).long()
