"""Host buffers reused from call to call instead of new tensors (per thread, CPU only).

At `cpu.mmap_threshold_mb` 1 every host tensor of 1 MiB or more is fresh pages from the kernel, zero-filled on
first touch. Operands that are made, read once and dropped at every call (a padded GEMM operand, the LM head's
[k, V] logits) come instead from a buffer kept under a name and grown when a call needs more. Users:
grpo.cpu.kernels.pad_rows (names ``pad.*``) and grpo.modeling.fused_head through the buffer hook (``head.*``). The update frees
them all after its last backward pass (:func:`release`), so a rollout never holds them. On other devices
(CUDA's caching allocator reuses memory by itself) :func:`held` returns a new tensor.
"""

from __future__ import annotations

import math
import threading

import torch


class _Held(threading.local):
    """Per thread: flat buffers by (name, dtype)."""

    def __init__(self):
        self.buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}


_HELD = _Held()


def held(name: str, like: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    """A contiguous tensor of `shape` (stale contents) in `dtype` (default `like`'s) on `like`'s device: on the CPU a
    view of the buffer kept under `name`, valid until the next call with that name or :func:`release`."""
    dtype = dtype or like.dtype
    if like.device.type != "cpu":
        return like.new_empty(shape, dtype=dtype)
    need, key = math.prod(shape), (name, dtype)
    buf = _HELD.buffers.get(key)
    if buf is None or buf.numel() < need:
        _HELD.buffers.pop(key, None)                                        # freed before the larger one is made
        buf = _HELD.buffers[key] = like.new_empty(need, dtype=dtype)
    return buf[:need].view(shape)


def held_names() -> set[str]:
    """Names with a buffer kept in this thread."""
    return {name for name, _ in _HELD.buffers}


def release() -> None:
    """Free every buffer this thread keeps."""
    _HELD.buffers.clear()
