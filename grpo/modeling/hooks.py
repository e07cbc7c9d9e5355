"""The seam between the model code of this folder and a device runtime's accelerations.

Model code here is plain torch. Where a device has faster ways to do the same math (on the CPU: oneDNN GEMMs,
grpo's native AVX-512 kernels, kept host buffers), the runtime fills these hooks; grpo.training.cpu_runtime
installs grpo.cpu's, every other runtime keeps (or re-installs) the plain defaults. Two kinds:

- **per model, by module class**: the runtime places its own linear classes on grpo's model
  (``CpuRuntime.place``); model code asks a module through :func:`plain_linear`, :func:`layer_gemm` and
  :func:`grad_into`, never by naming a class.
- **per process**, :class:`ModelHooks` (:func:`install` / :func:`installed`): fused elementwise passes, the
  rollout's weight preparation for decode steps, reused buffers, the update's gradient buffer and what to free
  after an update.

Every hook computes the same values as the plain path (tests compare them); only speed and memory differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F


class Elementwise(Protocol):
    """Fused one-pass versions of elementwise work of the lean layers and the fused LM head (same formulas).
    ``applies(*tensors)`` says whether they serve these tensors (None entries skipped)."""

    def applies(self, *tensors: torch.Tensor | None) -> bool: ...
    def rms_norm_forward(self, x, weight, eps): ...
    def rms_norm_backward(self, gy, x, weight, r, need_x, need_w): ...
    def swiglu_forward(self, g, u): ...
    def swiglu_backward_(self, g, u, ga): ...
    def log_softmax_rows_(self, z, lse, entropy, logp): ...
    def head_grad_rows_(self, dz, lse, g_logp, g_entropy, entropy, tokens, temperature): ...


class LayerGemm(Protocol):
    """The GEMMs of a linear module class the runtime placed (its class attribute ``gemm``), used by the fused
    head and the lean MLP in place of ``torch.mm`` where :meth:`serves` says so.

    Shapes: mm a [M, K], b [N, K], bias [N] -> [M, N] (a b^T + bias); the products into a target are
    target [N, K] (+)= a^T b with a [M, N], b [M, K].
    """

    def serves(self, x: torch.Tensor, weight: torch.Tensor) -> bool: ...
    def mm(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor: ...
    def block_size(self, n: int, width: int) -> int: ...
    def add_product_(self, target, a, b, rows: int | None = None) -> torch.Tensor: ...
    def store_product_(self, target, a, b) -> torch.Tensor: ...
    def add_weight_grad_(self, param, a, b, rows: int | None = None, whole: bool = False) -> None: ...


class RolloutWeights:
    """How a rollout's decode steps prepare and multiply their weights (grpo.modeling.rollout_weights). The plain
    default packs nothing and multiplies with ``F.linear``; a runtime's version may pack the weights once per
    rollout into a layout its products read faster (:meth:`pack_rows` then returns the rows to pack for)."""

    def pack_rows(self, device: torch.device, dtype: torch.dtype, rows: int) -> int | None:
        """Rows to pack the weights for (products computed in `dtype` on `device`), or None: no packing."""
        return None

    def pack(self, weight: torch.Tensor, rows: int) -> torch.Tensor:
        """`weight` [N, K] prepared for products of about `rows` rows (only called when :meth:`pack_rows` said so)."""
        return weight

    def linear(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T + b for a weight as :meth:`pack` left it.  Shape: x [..., K] -> [..., N]"""
        return F.linear(x, weight, bias)

    def head(self, head: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The LM head's logits for a decode step (no packed copy).  Shape: x [n, D] -> [n, V]"""
        return head(x)


@dataclass
class ModelHooks:
    """The per-process hooks; these defaults are plain torch on any device."""

    elementwise: Elementwise | None = None
    rollout: RolloutWeights = field(default_factory=RolloutWeights)

    def buffer(self, name: str, like: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype | None = None):
        """A tensor of `shape` (stale contents) on `like`'s device for a call's scratch work; a runtime may hand out
        a buffer kept under `name` between calls (valid until the next call with that name)."""
        return like.new_empty(shape, dtype=dtype or like.dtype)

    def grad_buffer(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """Zeroed ``.grad`` views of one flat buffer per (device, dtype) for `params` without one
        (grpo.modeling.in_place.flat_gradients)."""
        from grpo.modeling.in_place import flat_gradients

        return flat_gradients(params, torch.zeros)

    def after_update(self) -> None:
        """Called once after the update's last backward pass: free what the passes kept."""


_INSTALLED = [ModelHooks()]


def installed() -> ModelHooks:
    """The hooks in force in this process (plain torch unless a runtime installed its own)."""
    return _INSTALLED[0]


def install(hooks: ModelHooks | None) -> ModelHooks:
    """Put `hooks` in force (None: the plain defaults); returns the ones they replace (for tests to restore)."""
    previous, _INSTALLED[0] = _INSTALLED[0], hooks if hooks is not None else ModelHooks()
    return previous


def plain_linear(module: torch.nn.Module) -> bool:
    """A plain ``nn.Linear`` but for how it multiplies (same parameters): ``nn.Linear`` itself or a runtime's class
    that says so (class attribute ``plain_linear``)."""
    return type(module) is torch.nn.Linear or bool(getattr(type(module), "plain_linear", False))


def layer_gemm(module: torch.nn.Module) -> LayerGemm | None:
    """The module class's own GEMMs (:class:`LayerGemm`), or None for torch's."""
    return getattr(type(module), "gemm", None)


def grad_into(module: torch.nn.Module) -> bool:
    """The module adds its weight (and bias) gradients into ``.grad`` in place instead of returning them to autograd
    (attribute ``grad_into``; the runtime sets it on its classes in a single process)."""
    return bool(getattr(module, "grad_into", False))
