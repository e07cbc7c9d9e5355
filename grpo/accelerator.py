"""The accelerator interface: every ``torch.cuda`` call of a run goes through one small object per device type.

The CUDA runtime (grpo/training/runtime.py) asks its accelerator for the free memory, the peak allocation, the
generator state, and to read device values back to the host. :class:`CudaAccelerator` answers with ``torch.cuda``;
:class:`MetaAccelerator` answers for the ``meta`` device, which stands in for a GPU on machines without one: a model
on ``meta`` runs forward, backward and an optimizer step with real shapes and no values, and a CPU tensor meeting
its tensors raises ("Tensor on device cpu is not on the expected device meta"). So the CUDA runtime's code, run on
``meta``, shows every tensor of the step is made on the device and every device value read is one the step meant.

Device reads are what a GPU waits for (each one is a synchronisation). The step reads device values only through
:func:`host_values` (the update's statistics, once per step) and :func:`host_copy` (the batch's masks and token ids,
once per step, for the host-side decisions: micro-batches, padding, shared prompts); the meta accelerator counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class HostAccelerator:
    """The CPU: device values are host values (a read is free, no copy)."""

    type = "cpu"

    def read(self, t: torch.Tensor) -> list:
        return t.tolist()

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t


class CudaAccelerator:
    """``torch.cuda``: the only place outside the vLLM transport that calls it."""

    type = "cuda"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def is_initialized(self) -> bool:
        return torch.cuda.is_available() and torch.cuda.is_initialized()

    def set_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def current_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        return torch.cuda.mem_get_info(device)

    def memory_allocated(self, device: torch.device) -> int:
        return torch.cuda.memory_allocated(device)

    def max_memory_allocated(self, device: torch.device) -> int:
        return torch.cuda.max_memory_allocated(device)

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def get_rng_state(self) -> torch.Tensor | None:
        return torch.cuda.get_rng_state() if self.is_initialized() else None

    def set_rng_state(self, state: torch.Tensor) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(state)

    def read(self, t: torch.Tensor) -> list:
        return t.tolist()                                      # one synchronisation

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t.to("cpu")                                     # one synchronisation


@dataclass
class MetaAccelerator:
    """``meta`` standing in for a GPU of `total_bytes`. A read answers zeros (meta tensors hold no values) and is
    counted in `reads`; a host copy cannot be answered, so the caller must already hold the host side (the batch's
    :class:`grpo.types.HostView`, as a CUDA run's rollout has it): asking for one raises."""

    total_bytes: int = 80 * 2 ** 30
    reads: list = field(default_factory=list)                 # the shapes read, in order
    type = "meta"

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return False                                          # no generator state to save

    def set_device(self, device: torch.device) -> None:
        pass

    def current_device(self) -> torch.device:
        return torch.device("meta")

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        return self.total_bytes, self.total_bytes

    def memory_allocated(self, device: torch.device) -> int:
        return 0

    def max_memory_allocated(self, device: torch.device) -> int:
        return 0

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        pass

    def get_rng_state(self) -> None:
        return None

    def set_rng_state(self, state: torch.Tensor) -> None:
        pass

    def read(self, t: torch.Tensor) -> list:
        if t.device.type != "meta":
            raise RuntimeError(f"a step value on {t.device} reached the meta accelerator's read: it was made off the device")
        self.reads.append(tuple(t.shape))
        return torch.zeros(t.shape, dtype=torch.float64, device="cpu").tolist()

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"a host copy of a meta tensor {tuple(t.shape)} was asked for: the meta runtime has no "
                           "values; give the batch its host view (grpo.types.HostView) as the rollout does")


ACCELERATORS: dict[str, object] = {"cpu": HostAccelerator(), "cuda": CudaAccelerator(), "meta": MetaAccelerator()}


def accelerator(device: torch.device | str):
    """The accelerator of `device`'s type (cpu | cuda | meta)."""
    return ACCELERATORS[torch.device(device).type]


def host_values(t: torch.Tensor) -> list:
    """``t.tolist()`` through its device's accelerator: the one read a step makes of its statistics."""
    return accelerator(t.device).read(t)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` on the host (the tensor itself on the CPU): through its device's accelerator."""
    return accelerator(t.device).to_host(t)
