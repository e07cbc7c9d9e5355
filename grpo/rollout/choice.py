"""Choosing each decode step's tokens: logit filters (temperature, top-k, top-p, min-p), the repetition
penalty, and one inverse-CDF draw per row from a keyed uniform (grpo/rollout/keyed.py). Pure functions of
[n, V] logits, used by the single-turn sampler (grpo/rollout/sampler.py) and multi-turn episodes."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p (nucleus), then min-p filtering; removed entries become -inf
    (the order of Hugging Face's generate).

    ``top_k == 0``, ``top_p >= 1`` and ``min_p == 0`` disable the corresponding filter. Top-k keeps ties
    with the k-th largest logit. Top-p keeps the smallest prefix of the descending-sorted distribution
    whose cumulative probability reaches ``top_p`` (always at least the most likely token). Min-p keeps
    the tokens whose probability is at least ``min_p`` times the most likely one's (Nguyen et al., arXiv
    2407.01082): p_v >= min_p * max_u p_u, i.e. z_v >= max z + log(min_p) on the filtered logits z.
    ``temperature`` must be > 0 (greedy decoding does not filter).

    Shape:
        logits: [..., V] -> [..., V] float32
    """
    logits = logits.float() / temperature  # [..., V]
    if top_k > 0:
        kth_largest = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))  # [..., V]
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [..., V]
        sorted_probs = sorted_logits.softmax(dim=-1)  # [..., V]
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V]
        drop_sorted = mass_before >= top_p  # [..., V] the prefix before this token already suffices
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # [..., V] back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))  # [..., V]
    if min_p > 0.0:
        floor = logits.amax(dim=-1, keepdim=True) + math.log(min_p)  # [..., 1]
        logits = logits.masked_fill(logits < floor, float("-inf"))  # [..., V]
    return logits


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The repetition penalty of CTRL (Keskar et al., arXiv 1909.05858) as Hugging Face applies it, before
    temperature: a token already in the row's prompt or completion has its logit divided by ``penalty``
    when positive and multiplied by it when negative (``penalty`` > 1 discourages repeats).

    Shape:
        logits: [n, V], seen: [n, V] bool -> [n, V] float32
    """
    z = logits.float()
    return torch.where(seen, torch.where(z > 0, z / penalty, z * penalty), z)


def mark_seen(seen: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mark `tokens` in each row's set of seen tokens (in place); `mask` (same shape as `tokens`): only where 1.

    Shape:
        seen: [n, V] bool, tokens: [n] or [n, L] long -> seen
    """
    tokens = tokens.reshape(seen.size(0), -1)  # [n, L]
    hit = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.reshape(tokens.shape).bool()  # [n, L]
    rows = torch.arange(seen.size(0), device=seen.device)[:, None].expand_as(tokens)  # [n, L]
    seen[rows[hit], tokens[hit]] = True
    return seen


def draw(probs: torch.Tensor, uniforms: torch.Tensor, cdf_out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from (unnormalised) probabilities by inverse-CDF sampling.

    token = min{v : C_v > u * C_V}, with C the float64 cumulative sum over the vocabulary and
    u in [0, 1) the row's uniform, so for u ~ U[0, 1) P(token = v) = p_v / sum(p): the distribution of
    ``torch.multinomial(probs, 1)``, which on CPU draws V exponentials per row (9 ms per decode step
    at 16 rows x 32k vocabulary) where this uses one uniform. A zero-probability token is never
    chosen (its C_v equals C_{v-1}). `cdf_out`: a float64 [n, V] buffer for C (else a new tensor).

    Shape:
        probs: [n, V], uniforms: [n] float64 -> [n] long
    """
    if cdf_out is None:
        cdf = probs.double().cumsum(dim=-1)  # [n, V]
    else:  # cumsum(dtype=) converts into a new tensor first
        cdf = cdf_out.copy_(probs).cumsum_(dim=-1)  # [n, V]
    u = uniforms.to(cdf.dtype)[:, None]  # [n, 1]
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # [n, 1]
    return tokens.squeeze(-1).clamp_(max=probs.size(-1) - 1)  # [n]


class Scratch:
    """The [n, V] buffers of one rollout's token choices (log-probs, probabilities, float64 CDF), made at the first
    step's row count and viewed at fewer rows as rows finish: a decode step otherwise allocates ~14 MiB of new
    tensors at 16 rows x 32k vocabulary, fresh pages from the kernel each time at `cpu.mmap_threshold_mb` 1
    (measured on qwen2 768x12: 0.1-0.3 s of a 1-1.7 s, 32-token rollout in exp, cumsum and copies)."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A [n, V] buffer of `dtype` on `like`'s device (`like`: [n, V]); its contents are stale."""
        n, V = like.shape
        buf = self.buffers.get(name)
        if buf is None or buf.shape[0] < n or buf.shape[1] != V or buf.dtype != dtype or buf.device != like.device:
            buf = self.buffers[name] = torch.empty(n, V, dtype=dtype, device=like.device)
        return buf[:n]


def choose_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    uniforms: torch.Tensor | None,
    scratch: Scratch | None = None,
    min_p: float = 0.0,
    seen: torch.Tensor | None = None,
    repetition_penalty: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return it with its log-prob under the distribution it came from.

    With ``repetition_penalty`` != 1 and ``seen`` ([n, V] bool: the tokens of each row's prompt and
    completion so far) the logits are first penalised (:func:`penalize_repeats`), greedy decoding too.
    ``temperature == 0`` is greedy: argmax of the logits, log-prob from their log-softmax
    (``uniforms`` unused, may be None). Otherwise one :func:`draw` over the filtered distribution
    (:func:`filter_logits`: temperature, top-k, top-p, min-p).
    `scratch` (:class:`Scratch`) holds the [n, V] intermediates across steps; the values are the same.

    Shape:
        logits: [n, V], uniforms: [n] float64 -> tokens [n] long, logprobs [n] float32
    """
    if seen is not None and repetition_penalty != 1.0:
        logits = penalize_repeats(logits, seen, repetition_penalty)  # [n, V]
    if temperature == 0:
        logprobs = F.log_softmax(logits.float(), dim=-1)  # [n, V]
        tokens = logprobs.argmax(dim=-1)  # [n]
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # [n], [n]
    plain = logits.dtype == torch.float32 and temperature == 1.0 and top_k <= 0 and top_p >= 1.0 and min_p <= 0.0
    z = logits if plain else filter_logits(logits, temperature, top_k, top_p, min_p)  # [n, V] (x / 1.0 is x)
    if scratch is None:
        logprobs = F.log_softmax(z, dim=-1)  # [n, V]
        tokens = draw(logprobs.exp(), uniforms)  # [n]
    else:
        logprobs = torch.log_softmax(z, dim=-1, out=scratch.get("logp", z, torch.float32))  # [n, V]
        probs = torch.exp(logprobs, out=scratch.get("p", z, torch.float32))  # [n, V]
        tokens = draw(probs, uniforms, scratch.get("cdf", z, torch.float64))  # [n]
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # [n], [n]
