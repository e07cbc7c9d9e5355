"""The CPU runtime's fill of grpo.modeling.hooks: what model code calls on the CPU in place of plain torch.

- fused elementwise passes: grpo.cpu.native_elementwise (`cpu.elementwise_kernel`);
- the rollout's decode weights: packed once per rollout for oneDNN or grpo's native decode kernel
  (grpo.cpu.kernels.prepack, `cpu.decode_kernel`) and multiplied by grpo.cpu.kernels.linear;
- scratch buffers kept between calls (grpo.cpu.workspace), freed after each update;
- the update's gradient buffer on transparent huge pages (grpo.cpu.grad_in_place.gradient_buffer, `cpu.huge_pages`).

The per-module hooks (DnnLinear's GEMMs, in-place gradients) come with the classes grpo.cpu.placement places.
"""

from __future__ import annotations

import torch

from grpo.cpu import native_elementwise, workspace
from grpo.cpu.grad_in_place import gradient_buffer
from grpo.cpu.kernels import can_prepack, linear, prepack
from grpo.modeling.hooks import ModelHooks, RolloutWeights, plain_linear


class CpuRolloutWeights(RolloutWeights):
    """Decode weights packed for oneDNN (or the native kernel at <= 64 float32 rows) where the CPU can
    (grpo.cpu.kernels.can_prepack: float32, or bfloat16 with native bf16 GEMMs), products by oneDNN."""

    def pack_rows(self, device: torch.device, dtype: torch.dtype, rows: int) -> int | None:
        return rows if can_prepack(device, dtype) else None

    def pack(self, weight: torch.Tensor, rows: int):
        return prepack(weight, rows)

    def linear(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, weight, bias)

    def head(self, head: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A plain LM head through oneDNN like the projections (2x MKL at 16 rows x 32k vocabulary); others (LoRA)
        by their own forward."""
        return linear(x, head.weight, head.bias) if plain_linear(head) else head(x)


class CpuHooks(ModelHooks):
    """grpo.modeling.hooks.ModelHooks for the CPU runtime (same values as the plain defaults)."""

    def __init__(self):
        super().__init__(elementwise=native_elementwise, rollout=CpuRolloutWeights())

    def buffer(self, name: str, like: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype | None = None):
        return workspace.held(name, like, shape, dtype)

    def grad_buffer(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return gradient_buffer(params)

    def after_update(self) -> None:
        workspace.release()            # the LM head's and padding's kept buffers: not through the optimizer step or rollout
