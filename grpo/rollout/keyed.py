"""Counter-based sampling randomness: every uniform is a pure function of its keys.

The uniform that draws token ``t`` of sample ``g`` of the prompt at global position ``p`` (its draw
position in the run's prompt order, grpo.data.prompts.PromptStream.position) is

    u(seed, p, g, t) = unit(mix(key(seed, p, g) + (t + 1) * GAMMA)),
    key(seed, p, g)  = mix(mix(mix(seed) + (p + 1) * GAMMA) + (g + 1) * GAMMA)

with ``mix`` the SplitMix64 finalizer (a bijection of 64-bit integers, Steele, Lea & Flood, "Fast
splittable pseudorandom number generators", OOPSLA 2014) and ``GAMMA`` its golden-ratio increment:
each row is a SplitMix64 stream seeded with its key, token ``t`` takes the stream's ``t``-th output.
Nothing depends on which other rows are in the batch, in which order, on which rank, or which rows
have already finished, so a prompt samples the same completions in a batch of 64 on one process as
in a batch of 8 on rank 5 of 8. All arithmetic is on int64 tensors on the rows' device and wraps
modulo 2**64 (two's complement), which torch's integer kernels do on CPU and CUDA alike;
``tests/rollout/test_keyed.py`` checks the values against a pure-Python reference.
"""

from __future__ import annotations

import torch

_U64 = 1 << 64


def as_int64(x: int) -> int:
    """A Python int reduced modulo 2**64 into int64's range [-2**63, 2**63)."""
    return (x + (1 << 63)) % _U64 - (1 << 63)


GAMMA = as_int64(0x9E3779B97F4A7C15)        # SplitMix64's increment (2**64 / golden ratio, odd)
_M1 = as_int64(0xBF58476D1CE4E5B9)
_M2 = as_int64(0x94D049BB133111EB)


def shift_right(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic on signed ints).

    Shape: [...] -> [...] int64
    """
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer: a bijection of 64-bit patterns that spreads every input bit.

    Shape: [...] int64 -> [...] int64
    """
    x = (x ^ shift_right(x, 30)) * _M1
    x = (x ^ shift_right(x, 27)) * _M2
    return x ^ shift_right(x, 31)


def child_key(parent: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """The key of child ``index`` (>= 0) of ``parent``: SplitMix64 output ``index`` of a stream seeded ``parent``.

    Shape: parent [...] int64, index [...] (broadcast) or int -> [...] int64
    """
    if isinstance(index, int):
        return mix64(parent + as_int64((index + 1) * GAMMA))
    return mix64(parent + (index + 1) * GAMMA)


def row_keys(seed: int, prompt_index: torch.Tensor, num_generations: int) -> torch.Tensor:
    """The key of every row ``i * G + g`` (sample ``g`` of the prompt at global position ``prompt_index[i]``).

    Shape: prompt_index [B] long -> [B * G] int64, on prompt_index's device
    """
    device = prompt_index.device
    root = mix64(torch.tensor(as_int64(seed), dtype=torch.long, device=device))             # []
    prompts = child_key(root, prompt_index.long())                                           # [B]
    samples = torch.arange(num_generations, dtype=torch.long, device=device)                # [G]
    return child_key(prompts[:, None], samples[None, :]).reshape(-1)                        # [B * G]


def token_uniforms(keys: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
    """The uniform in [0, 1) that draws token ``t`` of each row (53 random bits, as ``torch.rand``).

    Shape: keys [n] int64, t int -> [n] float64; keys [n, 1], t [K] long (steps) -> [n, K] float64
    """
    return shift_right(child_key(keys, t), 11).double() * 2.0 ** -53                      # [n] | [n, K]
