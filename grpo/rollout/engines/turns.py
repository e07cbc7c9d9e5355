"""Multi-turn episodes on an engine that generates whole turns (transformers, vLLM): the same driver and the same
Generation as grpo/rollout/multiturn.py's token-by-token loop, built turn by turn.

    turn 0: every prompt, n = G completions each (one engine call)
    each row: its tokens are shown to the driver one by one (after_token); at the first that ends the turn
        (an EOS, a closed tool call: observation tokens to feed, or done) the rest of the turn is dropped
    turn k: the rows still running continue from prompt + everything so far (their own model and observation
        tokens: no re-tokenisation), n = 1 each, until every episode ended or `max_tokens` (all tokens of an
        episode, observations included) is used up

Seeds: turn k of row i*G + g is the engine's request for "prompt" (index_i * G + g) under the seed of child k of
the run seed, so episodes repeat under one seed as far as the engine's own sampling does.
"""

from __future__ import annotations

import torch

from grpo.rollout.multiturn import written_mask
from grpo.rollout.params import Prompts, SamplingParams, prompt_seeds
from grpo.types import Generation


def _left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long, device="cpu")
    mask = torch.zeros(len(seqs), width, dtype=torch.long, device="cpu")
    for i, s in enumerate(seqs):
        ids[i, width - len(s):], mask[i, width - len(s):] = torch.tensor(s, dtype=torch.long, device="cpu"), 1
    return ids, mask


class _Episode:
    """One row's tokens so far: ids, the sampler's log-probs, 1 on the model's tokens."""

    def __init__(self):
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.action: list[int] = []
        self.ended_by_eos = False

    def add(self, ids, logprobs, action: int) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.action += [action] * len(ids)


def _consume(row: int, ep: _Episode, tokens: list[int], logprobs: list[float], driver, eos: set[int],
             cap: int) -> bool:
    """Show one turn's tokens to the driver; True when the episode goes on (an observation was appended)."""
    for t, lp in zip(tokens, logprobs):
        ep.add([t], [lp], 1)
        if t in eos:
            ep.ended_by_eos = True
            driver.finish(row, True)
            return False
        obs, done = driver.after_token(row, t)
        if done:
            driver.finish(row, False)
            return False
        if obs:
            room = cap - len(ep.ids)
            ep.add(list(obs)[:room], [0.0] * min(len(obs), room), 0)
            if len(ep.ids) >= cap:
                driver.finish(row, False)             # the observation used up the token cap
                return False
            return True
        if len(ep.ids) >= cap:
            break
    driver.finish(row, False)                         # cut by the token cap
    return False


def play_turns(engine, prompts: Prompts, driver, params: SamplingParams, pad_token_id: int) -> Generation:
    """G episodes per left-padded prompt through `engine.generate` (module docstring).
    Shape: prompts.ids, prompts.mask [B, P], prompts.index [B] -> Generation of B * G rows with action_mask."""
    prompt_ids, prompt_mask = prompts.ids, prompts.mask
    B, G, cap = prompt_ids.size(0), params.n, params.max_tokens
    index = (torch.arange(B, device="cpu") if prompts.index is None else prompts.index.detach().cpu()).long()   # [B]
    prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]
    eos = set(params.stop_token_ids)
    episodes = [_Episode() for _ in range(B * G)]
    gen = engine.generate(prompt_ids, prompt_mask, params, prompt_index=index)
    running = [r for r in range(B * G) if _consume(r, episodes[r], *_row(gen, r), driver, eos, cap)]
    turn = 0
    while running:
        turn += 1
        ids, mask = _left_pad([prompts[r // G] + episodes[r].ids for r in running], pad_token_id)
        room = max(cap - len(episodes[r].ids) for r in running)
        seed = prompt_seeds(params.seed, torch.tensor([turn], device="cpu"))[0]
        rows = torch.tensor([int(index[r // G]) * G + r % G for r in running], dtype=torch.long, device="cpu")
        gen = engine.generate(ids, mask, params.with_(n=1, max_tokens=room, seed=seed), prompt_index=rows)
        running = [r for j, r in enumerate(running)
                   if _consume(r, episodes[r], *_row(gen, j), driver, eos, cap)]
    return _generation(prompt_ids, prompt_mask, episodes, G, pad_token_id)


def _row(gen: Generation, j: int) -> tuple[list[int], list[float]]:
    """Row j's generated tokens (up to its mask) and their log-probs."""
    keep = gen.completion_mask[j].bool().cpu()
    return gen.completion_ids[j].cpu()[keep].tolist(), gen.sampling_logprobs[j].cpu()[keep].tolist()


def _generation(prompt_ids, prompt_mask, episodes: list[_Episode], G: int, pad: int) -> Generation:
    T = max(1, max(len(e.ids) for e in episodes))
    N = len(episodes)
    ids = torch.full((N, T), pad, dtype=torch.long, device="cpu")
    logprobs = torch.zeros(N, T, device="cpu")
    action = torch.zeros(N, T, dtype=torch.long, device="cpu")
    for r, e in enumerate(episodes):
        n = len(e.ids)
        ids[r, :n], logprobs[r, :n] = torch.tensor(e.ids, dtype=torch.long, device="cpu"), torch.tensor(e.logprobs, device="cpu")
        action[r, :n] = torch.tensor(e.action, dtype=torch.long, device="cpu")
    written = written_mask(action)                                                 # [N, T]
    device = prompt_ids.device
    return Generation(
        prompt_ids=prompt_ids.repeat_interleave(G, dim=0), prompt_mask=prompt_mask.repeat_interleave(G, dim=0),
        completion_ids=torch.where(written.bool(), ids, torch.full_like(ids, pad)).to(device),
        completion_mask=written.to(device), sampling_logprobs=(logprobs * action).to(device),
        truncated=~torch.tensor([e.ended_by_eos for e in episodes], dtype=torch.bool, device=device),
        action_mask=(action * written).to(device))
