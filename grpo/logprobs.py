"""Per-token log-probabilities and entropies of completions under a causal LM.

Only the last T + 1 positions are projected to the vocabulary (``logits_to_keep``), and the
log-softmax is taken row chunk by row chunk, gathering just the chosen tokens' log-probs, so no
full float32 ``[N, T, V]`` log-softmax tensor is kept alive.
"""

from __future__ import annotations

import torch

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


def completion_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        completion_length: int, temperature: float = 1.0,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) for the last `completion_length` tokens of each row.

    The logits are divided by the sampling temperature (as during rollout) when temperature > 0.

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

