"""Per-token log-probabilities and entropies of completions under a causal LM.

Chunked path (the default, for any model whose logits are ``lm_head(last_hidden_state)``, LoRA
wrappers included): the backbone runs to hidden states, then only the *real* completion positions
(attention mask 1) go through the LM head, ``chunk_size`` tokens at a time. Each chunk's float32
logits live only while that chunk's log-softmax is taken; with autograd, each chunk is wrapped in
activation checkpointing, so the backward pass recomputes that chunk's logits instead of storing
them. No ``[N, T, V]`` tensor is ever materialised, in the model dtype or in float32. A plain float32 /
float64 ``nn.Linear`` head outside autocast runs all its chunks through one reused buffer instead, in one
autograd node with the same recompute (:mod:`grpo.modeling.fused_head`).

Padding costs nothing either: each micro-batch is trimmed to its longest row (leading columns that
are padding in every row, trailing completion columns that are padding in every row) before the
forward pass; :func:`length_order` lets callers bucket rows of similar length into micro-batches.
Log-probs and entropies at padded completion positions are 0.

Fallback (models with a logit soft-cap or scale, prompt-learning peft models, anything without a
separate backbone and output embedding): the model's own forward with ``logits_to_keep = T + 1``,
then the log-softmax in row chunks (:func:`selective_logprobs`, :func:`logprobs_and_entropy`).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from grpo.modeling import fused_head
from grpo.modeling.precision import cast_frozen_linears
from grpo.modeling.decoder import positions_from_mask
from grpo.modeling.shared_prompt import completion_hidden
from grpo.types import HostView

#: Default logits per chunk of the chunked path: 2**23 float32 values = 32 MiB (256 tokens at V = 32k).
CHUNK_LOGITS = 2 ** 23
#: Config attributes that mean the logits are not simply ``lm_head(hidden)`` (soft-caps, scales).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def upcast(x: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 -> float32; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# --- the logits path (fallback) ----------------------------------------------------------------------

def selective_logprobs(logits: torch.Tensor, tokens: torch.Tensor, chunk_rows: int = 16) -> torch.Tensor:
    """log softmax(logits)[token] = logit[token] - logsumexp(logits), in row chunks.

    Shape:
        logits: [N, T, V], tokens: [N, T]  ->  [N, T] float32
    """
    out = []
    for start in range(0, logits.shape[0], chunk_rows):
        lg = upcast(logits[start:start + chunk_rows])                     # [n, T, V]
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
        logp = torch.log_softmax(upcast(logits[start:start + chunk_rows]), dim=-1)  # [n, T, V]
        out.append(-(logp.exp() * logp).sum(dim=-1))                                # [n, T]
    return torch.cat(out, dim=0)


def _logprobs_and_entropy_chunk(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p[token] and H = -sum_v p_v log p_v from one log-softmax.  [..., V], [...] -> [...] x 2."""
    logp = torch.log_softmax(upcast(logits), dim=-1)                              # [..., V]
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)                     # [...]
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


def logits_path(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int,
                temperature: float, with_entropy: bool, entropy_grad: bool, model_inputs: dict | None = None):
    """The model's own forward (``logits_to_keep = T + 1``), log-softmax in row chunks. `model_inputs`:
    extra forward inputs of the rows, [N, ...] each (a VLM's pixel_values).

    Shape:
        input_ids, attention_mask: [N, P + T]  ->  logp: [N, T], entropy: [N, T] or None
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=positions_from_mask(attention_mask), use_cache=False, logits_to_keep=T + 1,
                **(model_inputs or {}))
    logits = out.logits[:, :-1, :]                                          # [N, T, V] predicts tokens P..P+T-1
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if entropy_grad:
        return logprobs_and_entropy(logits, input_ids[:, -T:])              # [N, T] x 2, with grad
    logp = selective_logprobs(logits, input_ids[:, -T:])                    # [N, T]
    return logp, (entropy_from_logits(logits.detach()) if with_entropy else None)


# --- the chunked path ------------------------------------------------------------------------------

def split_model(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(backbone, lm_head) when the logits are exactly ``lm_head(backbone(...).last_hidden_state)``.

    A peft LoRA model is split through its base model, whose layers carry the adapters (so
    ``disable_adapter()`` still applies). Returns None when the chunked path cannot reproduce the
    model's logits: prompt-learning peft models, logit soft-caps or scales, no separate backbone.
    """
    inner = model
    if hasattr(model, "get_base_model"):
        peft_config = getattr(model, "active_peft_config", None)
        if peft_config is None or getattr(peft_config, "is_prompt_learning", False):
            return None
        inner = model.get_base_model()
    config = getattr(inner, "config", None)
    if config is None or any(getattr(config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORMS):
        return None
    backbone = getattr(inner, "base_model", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if backbone is None or backbone is inner or not isinstance(head, torch.nn.Module):
        return None
    return backbone, head


def kept_columns(host_mask: torch.Tensor, T: int) -> tuple[int, int]:
    """(first, end) of the columns :func:`trim_padding` keeps, decided on the host mask.

    Shape: host_mask [n, P + T] (CPU) -> two column indices
    """
    used = host_mask.bool().any(dim=0)                                      # [P + T]
    P = host_mask.shape[1] - T
    first = int(used[:P].long().argmax()) if bool(used[:P].any()) else P    # first real prompt column
    kept_T = max(1, int(used[P:].nonzero().max()) + 1) if bool(used[P:].any()) else 1
    return first, P + kept_T


def trim_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 T: int, host_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Drop prompt columns that are padding in every row and completion columns likewise at the end.

    Left padding is excluded from attention and positions come from the mask, and no real token
    attends to a later column, so the real tokens' outputs do not change. At least one completion
    column is kept. The columns are chosen on `host_mask` (the same mask on the CPU; None: `attention_mask`).

    Shape:
        [n, P + T] -> ids, mask: [n, P' + T'], T' <= T
    """
    first, end = kept_columns(attention_mask if host_mask is None else host_mask, T)
    return input_ids[:, first:end], attention_mask[:, first:end], end - input_ids.shape[1] + T


def chunk_tokens(vocab_size: int, chunk_size: int = 0) -> int:
    """Tokens per LM-head chunk: ``chunk_size``, or 0 = about :data:`CHUNK_LOGITS` logits per chunk."""
    return chunk_size if chunk_size > 0 else max(16, CHUNK_LOGITS // max(vocab_size, 1))


def head_chunk(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
               with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """LM head, temperature, log-softmax for one chunk of token positions.

    Shape:
        hidden: [k, H], tokens: [k]  ->  logp [k] float32, entropy [k] float32 (zeros if not asked)
    """
    logits = upcast(head(hidden))                                           # [k, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)                                # [k, V]
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)              # [k]
    if not with_entropy:
        return picked, torch.zeros_like(picked)
    return picked, -(logp.exp() * logp).sum(dim=-1)                         # [k], [k]


def chunked_head(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                 with_entropy: bool, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`head_chunk` over ``chunk_size`` positions at a time, checkpointed under autograd.

    Shape:
        hidden: [M, H], tokens: [M]  ->  logp [M], entropy [M] (float32)
    """
    if fused_head.applies(head, hidden):                                    # one buffer for every chunk's logits
        return fused_head.head_logprobs(head, hidden, tokens, temperature, with_entropy, chunk_size)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    logps, ents = [], []
    for s in range(0, hidden.shape[0], chunk_size):
        h, tk = hidden[s:s + chunk_size], tokens[s:s + chunk_size]
        lp, ent = (checkpoint(head_chunk, head, h, tk, temperature, with_entropy, use_reentrant=False) if grad
                   else head_chunk(head, h, tk, temperature, with_entropy))
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents)


def scatter_rows(values: torch.Tensor, active: torch.Tensor, T: int) -> torch.Tensor:
    """Values of the active positions back into a zero-filled [n, T] grid (autograd flows).

    Shape:
        values: [M], active: [n, T'] bool with M true entries, T >= T'  ->  [n, T]
    """
    n, kept = active.shape
    grid = values.new_zeros(n, kept).masked_scatter(active, values)        # [n, T']
    return torch.nn.functional.pad(grid, (0, T - kept))                     # [n, T]


def chunked_path(parts: tuple[torch.nn.Module, torch.nn.Module], input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, T: int, temperature: float, with_entropy: bool,
                 entropy_grad: bool, chunk_size: int = 0, host: HostView | None = None):
    """Backbone on the trimmed batch (each distinct prompt once: :mod:`grpo.modeling.shared_prompt`), then the
    LM head only on real completion tokens, in chunks. Which columns, prompts and tokens those are is decided on
    `host` (the rows on the CPU; None: a copy of them, which on an accelerator is a device read).

    Shape:
        input_ids, attention_mask: [N, P + T]  ->  logp: [N, T], entropy: [N, T] or None
    """
    backbone, head = parts
    host = HostView.of(input_ids, attention_mask) if host is None else host
    first, end = kept_columns(host.attention_mask, T)
    kept = end - input_ids.shape[1] + T
    ids, mask = input_ids[:, first:end], attention_mask[:, first:end]      # [n, P' + T']
    hidden = completion_hidden(backbone, ids, mask, kept,                   # [n, T', H] predicts the T' tokens
                               host.input_ids[:, first:end], host.attention_mask[:, first:end])
    active = mask[:, -kept:].bool()                                         # [n, T']
    at = host.attention_mask[:, end - kept:end].bool().reshape(-1).nonzero().squeeze(1)   # [M] real tokens, host
    at = at.to(hidden.device)                                               # a copy to the device, not a read
    want_entropy = with_entropy or entropy_grad
    vocab = getattr(getattr(head, "weight", None), "shape", (0,))[0]
    step = chunk_tokens(vocab, chunk_size)
    logp, ent = chunked_head(head, hidden.flatten(0, 1).index_select(0, at),   # [M, H], [M]
                             ids[:, -kept:].reshape(-1).index_select(0, at), temperature, want_entropy, step)
    if at.shape[0] == 0:                                                    # keep the graph connected
        logp = logp + hidden.sum() * 0.0
    entropy = None
    if want_entropy:
        entropy = scatter_rows(ent if entropy_grad else ent.detach(), active, T)
    return scatter_rows(logp, active, T), entropy


def completion_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        completion_length: int, temperature: float = 1.0,
                        with_entropy: bool = False, entropy_grad: bool = False,
                        chunk_size: int = 0, model_inputs: dict | None = None,
                        host: HostView | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) for the last `completion_length` tokens of each row.

    The logits are divided by the sampling temperature (as during rollout) when temperature > 0.
    ``with_entropy`` adds the token entropy without autograd (metrics); ``entropy_grad`` adds it
    with autograd (entropy bonus in the loss) and implies ``with_entropy``. ``chunk_size`` is the
    number of tokens per LM-head chunk (0 = about 32 MiB of float32 logits per chunk). Positions
    whose attention mask is 0 (padding after EOS) get 0 on the chunked path. ``model_inputs`` (name ->
    [N, ...], a VLM's pixel_values) go to the model's own forward: rows with them take the logits path
    (the chunked path's backbone and shared prompts know only token ids). ``host``: the rows on the CPU
    (grpo.types.HostView), where the chunked path decides what to trim and share.

    Shape:
        input_ids, attention_mask: [N, P + T]  ->  logp: [N, T], entropy: [N, T] or None
    """
    parts = None if model_inputs else split_model(model)
    if parts is None:
        return logits_path(model, input_ids, attention_mask, completion_length, temperature, with_entropy,
                           entropy_grad, model_inputs)
    return chunked_path(parts, input_ids, attention_mask, completion_length, temperature, with_entropy,
                        entropy_grad, chunk_size, host)


def length_order(attention_mask: torch.Tensor) -> torch.Tensor:
    """Row order by number of real tokens (stable), so consecutive micro-batches trim well.

    Shape: [N, L] -> [N] long permutation
    """
    return torch.sort(attention_mask.sum(dim=1), stable=True).indices


@torch.no_grad()
def fixed_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_length: int, temperature: float = 1.0, micro_batch_size: int = 0,
                   chunk_size: int = 0, max_tokens: int = 0, with_entropy: bool = False,
                   model_inputs: dict | None = None, host: HostView | None = None):
    """Log-probs without autograd (old policy, reference), micro-batch by micro-batch; with
    `with_entropy`, also the entropy of the policy at each completion token (same pass, same budget).

    Micro-batches are those of the update (:func:`bucketed_micro_batches`: rows of similar length,
    at most `micro_batch_size` rows and `max_tokens` padded tokens each), so each trims its own
    padding; the result is in the original row order. `model_inputs` (name -> [N, ...]) are cut into
    the same micro-batches. Under autocast (`train.precision`) a frozen
    model's linear weights are cast once for the whole pass (:func:`grpo.modeling.precision.cast_frozen_linears`).

    Shape: [N, P + T] -> [N, T] (and entropy [N, T] with `with_entropy`)
    """
    was_training = model.training
    model.eval()  # no dropout: old/ref log-probs must be deterministic
    n = input_ids.shape[0]
    host = HostView.of(input_ids, attention_mask) if host is None else host     # the one device read of the pass
    out = torch.empty(n, completion_length, dtype=torch.float32, device=input_ids.device)
    ent = torch.empty_like(out) if with_entropy else None
    try:
        with cast_frozen_linears(model, input_ids.device):               # autocast: frozen weights cast once
            for idx in bucketed_micro_batches(host.attention_mask, micro_batch_size, max_tokens):
                logp, entropy = completion_logprobs(model, input_ids[idx], attention_mask[idx], completion_length,
                                                    temperature, chunk_size=chunk_size, with_entropy=with_entropy,
                                                    model_inputs={k: v[idx] for k, v in (model_inputs or {}).items()},
                                                    host=host.rows(idx))
                out[idx] = logp.float()
                if with_entropy:
                    ent[idx] = entropy.float()
    finally:
        model.train(was_training)
    return (out, ent) if with_entropy else out                          # [N, T]


def bucketed_micro_batches(attention_mask: torch.Tensor, size: int, max_tokens: int = 0) -> list:
    """Micro-batches of rows of similar length, each trimming its own padding.

    Rows are taken shortest first (:func:`length_order`); a micro-batch closes when it holds `size`
    rows or when one more row would make rows x (its longest row's real tokens) exceed `max_tokens`
    (every micro-batch holds at least one row). `size` = 0 and `max_tokens` <= 0: one slice. The same
    number of micro-batches is then evened out when every even one stays within both limits (:func:`even_split`):
    16 rows of 75 tokens at 401 tokens are 4 x 4 rows, not 5 + 5 + 5 + 1 (a one-row product wastes the GEMMs).

    Shape: attention_mask [N, L] -> list of [n] long row indices (or a single slice)
    """
    n = attention_mask.shape[0]
    size = size if 0 < size < n else n
    if size == n and (max_tokens <= 0 or n * int(attention_mask.sum(dim=-1).max()) <= max_tokens):
        return [slice(0, n)]
    order = length_order(attention_mask)                                     # [N] shortest first
    lengths = attention_mask.sum(dim=-1)[order].tolist()                     # [N] real tokens, ascending
    groups, start = [], 0
    for i in range(1, n + 1):
        full = i - start == size or (i < n and max_tokens > 0 and (i + 1 - start) * lengths[i] > max_tokens)
        if i == n or full:
            groups.append(order[start:i])
            start = i
    even = even_split(lengths, len(groups), size, max_tokens)
    return groups if even is None else [order[a:b] for a, b in even]


def even_split(lengths: list[int], count: int, size: int, max_tokens: int) -> list[tuple[int, int]] | None:
    """`count` contiguous groups of the ascending `lengths` whose row counts differ by at most one (the larger groups
    first, where the rows are shorter), as (start, end) pairs; None when one of them would hold more than `size`
    rows or more than `max_tokens` padded tokens (rows x its longest row; `max_tokens` <= 0: no limit)."""
    n, bounds, start = len(lengths), [], 0
    for g in range(count):
        end = start + n // count + (g < n % count)
        if end - start > size or (max_tokens > 0 and (end - start) * lengths[end - 1] > max_tokens):
            return None
        bounds.append((start, end))
        start = end
    return bounds
