"""Multi-turn rollouts: the model generates, a driver (tools, an environment) answers with observation
tokens, the model continues, in one decode loop over all G x B episodes.

    prompt -> prefill once -> per step, each running row either
        samples its next token (a model token: action mask 1), or
        is fed the next token of its pending observation (a forced token: action mask 0)
    -> after each sampled token the driver may end the turn (a tool call closed: observation tokens to
       feed, or the episode is over); an EOS (any id of `eos_token_id`) ends an episode; `max_new_tokens`
       caps all tokens of it

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

from typing import Protocol, Sequence

import torch

from grpo.rollout.eos import as_id_list
from grpo.rollout.sampler import choose_tokens, sampling_mode, start_rows, step_uniforms
from grpo.types import Generation


class Driver(Protocol):
    def after_token(self, row: int, token: int) -> tuple[list[int], bool]: ...

    def finish(self, row: int, ended_by_eos: bool) -> None: ...


@torch.no_grad()
def sample_episodes(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    driver: Driver,
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    seed: int = 0,
    prompt_index: torch.Tensor | None = None,
    lean: bool = True,
) -> Generation:
    """G episodes per left-padded prompt; row ``i * G + g`` is episode ``g`` of prompt ``i``.

    Returns a Generation whose completion holds every token after the prompt (the model's and the
    observations'), ``completion_mask`` 1 on all of them (they are context), ``action_mask`` 1 on the
    model's tokens only (what the loss and the KL see), ``sampling_logprobs`` 0 on observation tokens
    and ``truncated`` True for an episode that hit ``max_new_tokens`` or was ended by the driver
    without an EOS. ``eos_token_id``: one id or several (grpo.rollout.eos.eos_token_ids); any of them ends an
    episode.

    Shape:
        prompt_ids, prompt_mask: [B, P], prompt_index: [B] -> Generation with N = B * num_generations rows
    """
    with sampling_mode(model) as device:
        prompt_ids, prompt_mask, logits, decoding, running, keys = start_rows(
            model, prompt_ids, prompt_mask, num_generations, max_new_tokens, seed, prompt_index, lean, device)
        n_rows = running.numel()
        block = None
        completion_ids = torch.full((n_rows, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(n_rows, max_new_tokens, dtype=torch.float32, device=device)  # [N, max_new]
        action = torch.zeros(n_rows, max_new_tokens, dtype=torch.long, device=device)     # [N, max_new]
        pending: dict[int, list[int]] = {}          # row -> observation tokens still to feed
        ended_by_eos = [False] * n_rows             # host-side: the loop below syncs once per token
        eos = set(as_id_list(eos_token_id))          # the ids that end an episode, for that host loop
        steps = 0
        for step in range(max_new_tokens):
            block, uniforms = step_uniforms(keys, step, block, temperature)  # [n]
            tokens, token_logprobs = choose_tokens(logits, temperature, top_k, top_p, uniforms, min_p=min_p)  # [n], [n]
            rows = running.tolist()
            forced = [i for i, r in enumerate(rows) if pending.get(r)]
            is_action = torch.ones_like(tokens)
            if forced:                                 # observation tokens replace the draw, log-prob 0
                at = torch.tensor(forced, dtype=torch.long, device=device)
                tokens[at] = torch.tensor([pending[rows[i]].pop(0) for i in forced], dtype=torch.long, device=device)
                token_logprobs[at] = 0.0
                is_action[at] = 0
            completion_ids[running, step] = tokens
            logprobs[running, step] = token_logprobs
            action[running, step] = is_action
            steps = step + 1
            keep = [True] * len(rows)
            was_forced = set(forced)
            for i, (r, t) in enumerate(zip(rows, tokens.tolist())):
                if i in was_forced:
                    continue
                if t in eos:
                    keep[i], ended_by_eos[r] = False, True
                    driver.finish(r, True)
                    continue
                obs, done = driver.after_token(r, t)
                if done:
                    keep[i] = False
                    driver.finish(r, False)
                elif obs:
                    pending[r] = list(obs)
            if steps == max_new_tokens or not any(keep):
                for i, r in enumerate(rows):
                    if keep[i]:
                        driver.finish(r, False)                # cut by the token cap
                break
            if not all(keep):
                kept = torch.tensor([i for i, k in enumerate(keep) if k], dtype=torch.long, device=device)  # [n']
                decoding.select(kept)
                running, tokens, keys = running[kept], tokens[kept], keys[kept]
                block = block[kept] if block is not None else None
            logits = decoding.step(tokens)  # [n, V]

    completion_ids, action = completion_ids[:, :steps], action[:, :steps]  # [N, T]
    written = written_mask(action)                                           # [N, T]
    return Generation(
        prompt_ids=prompt_ids.repeat_interleave(num_generations, dim=0),  # [N, P]
        prompt_mask=prompt_mask.repeat_interleave(num_generations, dim=0),  # [N, P]
        completion_ids=torch.where(written.bool(), completion_ids, torch.full_like(completion_ids, pad_token_id)),
        completion_mask=written,
        sampling_logprobs=logprobs[:, :steps] * action,  # [N, T]
        truncated=~torch.tensor(ended_by_eos, dtype=torch.bool, device=device),  # [N]
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
