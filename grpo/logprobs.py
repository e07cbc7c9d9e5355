"""Per-token log-probabilities and entropies of completions under a causal LM.

Only the last T + 1 positions are projected to the vocabulary (``logits_to_keep``), and the
log-softmax is taken row chunk by row chunk, gathering just the chosen tokens' log-probs, so no
full float32 ``[N, T, V]`` log-softmax tensor is kept alive. The entropy is computed without
autograd for metrics, or with autograd (entropy bonus) under activation checkpointing: each chunk's
log-softmax is recomputed in the backward pass instead of being stored.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from grpo.rollout.sampler import positions_from_mask


def selective_logprobs(logits: torch.Tensor, tokens: torch.Tensor, chunk_rows: int = 16) -> torch.Tensor:
    """log softmax(logits)[token] = logit[token] - logsumexp(logits), in row chunks.

    Shape:
        logits: [N, T, V], tokens: [N, T]  ->  [N, T] float32
    """
    out = []
    for start in range(0, logits.shape[0], chunk_rows):
        lg = logits[start:start + chunk_rows].float()                     # [n, T, V]
        picked = lg.gather(-1, tokens[start:start + chunk_rows].unsqueeze(-1)).squeeze(-1)  # [n, T]
        out.append(picked - torch.logsumexp(lg, dim=-1))                  # [n, T]
    return torch.cat(out, dim=0)


@torch.no_grad()
def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = 16) -> torch.Tensor:
    """Token entropy H = -sum_v p_v log p_v, without autograd, in row chunks.

    Shape: [N, T, V] -> [N, T] float32
    """
    out = []
    for start in range(0, logits.shape[0], chunk_rows):
        logp = torch.log_softmax(logits[start:start + chunk_rows].float(), dim=-1)  # [n, T, V]
        out.append(-(logp.exp() * logp).sum(dim=-1))                                # [n, T]
    return torch.cat(out, dim=0)


def _logprobs_and_entropy_chunk(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p[token] and H = -sum_v p_v log p_v from one log-softmax.  [n, T, V], [n, T] -> [n, T] x 2."""
    logp = torch.log_softmax(logits.float(), dim=-1)                              # [n, T, V]
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)                     # [n, T]
    return picked, -(logp.exp() * logp).sum(dim=-1)


def logprobs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor,
                         chunk_rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen tokens' log-probs and token entropies, both with autograd, in row chunks.

    When ``logits`` requires grad, each chunk is checkpointed: only the logits (already alive) are
    kept for the backward pass, which recomputes that chunk's float32 log-softmax.

    Shape:
        logits: [N, T, V], tokens: [N, T]  ->  logp: [N, T] float32, entropy: [N, T] float32
    """
    parts = []
    for start in range(0, logits.shape[0], chunk_rows):
        lg, tk = logits[start:start + chunk_rows], tokens[start:start + chunk_rows]
        parts.append(checkpoint(_logprobs_and_entropy_chunk, lg, tk, use_reentrant=False)
                     if lg.requires_grad and torch.is_grad_enabled() else _logprobs_and_entropy_chunk(lg, tk))
    return torch.cat([p[0] for p in parts], dim=0), torch.cat([p[1] for p in parts], dim=0)


def completion_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        completion_length: int, temperature: float = 1.0,
                        with_entropy: bool = False,
                        entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) for the last `completion_length` tokens of each row.

    The logits are divided by the sampling temperature (as during rollout) when temperature > 0.
    ``with_entropy`` adds the token entropy without autograd (metrics); ``entropy_grad`` adds it
    with autograd (entropy bonus in the loss) and implies ``with_entropy``.

    Shape:
        input_ids, attention_mask: [N, P + T]  ->  logp: [N, T], entropy: [N, T] or None
    """
    T = completion_length
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=positions_from_mask(attention_mask), use_cache=False,
                logits_to_keep=T + 1)
    logits = out.logits[:, :-1, :]                                          # [N, T, V] predicts tokens P..P+T-1
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if entropy_grad:
        return logprobs_and_entropy(logits, input_ids[:, -T:])              # [N, T] x 2, with grad
    logp = selective_logprobs(logits, input_ids[:, -T:])                    # [N, T]
    entropy = entropy_from_logits(logits.detach()) if with_entropy else None
    return logp, entropy


@torch.no_grad()
def fixed_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_length: int, temperature: float = 1.0, micro_batch_size: int = 0) -> torch.Tensor:
    """Log-probs without autograd (old policy, reference), micro-batch by micro-batch.

    Shape: [N, P + T] -> [N, T]
    """
    was_training = model.training
    model.eval()  # no dropout: old/ref log-probs must be deterministic
    try:
        n = input_ids.shape[0]
        step = micro_batch_size or n
        parts = [completion_logprobs(model, input_ids[s:s + step], attention_mask[s:s + step],
                                     completion_length, temperature)[0] for s in range(0, n, step)]
    finally:
        model.train(was_training)
    return torch.cat(parts, dim=0)                                          # [N, T]

