"""Parameters kept off the compute device between uses: the reference policy's weights (`train.ref_offload`).

A frozen reference copy is used once per step, in the reference pass, yet it holds as much memory as the policy for
the whole step, next to the policy's gradients and AdamW's moments in the update. An offloaded module keeps its
parameter *objects* (so hooks, ties and names stay as they are) but swaps their data for empty tensors between uses;
:meth:`Offloaded.resident` loads them back for a block and empties them again when it ends. The values are the
stored bytes, bit for bit.

Stores (one per mode):

* ``disk`` (:class:`DiskStore`): the bytes in one unnamed temporary file (created unlinked, so nothing is left
  behind, whatever ends the process; the trainer puts it in `train.output_dir`, since a tmpfs /tmp is RAM).
  Reads come from the OS's page cache while memory is free; the cache gives the pages back under pressure, and
  they are read from the disk again at the next use. Neither is counted in the process's resident set: this is
  how a CPU run keeps the reference out of its peak.
* ``cpu`` (:class:`HostStore`): host memory (pinned when the target is a CUDA device), copied to the device for
  each use: a GPU run keeps the reference out of device memory (verl's reference ``param_offload``).
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile

import torch


def unique_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The module's parameters, a tied one once (the order of ``module.parameters()``)."""
    return list(dict.fromkeys(module.parameters()))


def tensor_bytes(tensors) -> int:
    """Bytes held by `tensors` (numel x element size)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _as_bytes(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's storage as a writable byte view (any dtype, bfloat16 included)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class DiskStore:
    """Tensors' bytes in one unnamed temporary file under `directory` (None = the system's temporary directory)."""

    def __init__(self, tensors, directory: str | None = None, pin: bool | None = None):
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.file = tempfile.TemporaryFile(dir=directory)                  # unlinked at once
        self.entries: list[tuple[int, torch.Size, torch.dtype]] = []     # (offset, shape, dtype)
        offset = 0
        for t in tensors:
            host = t.detach().to("cpu").contiguous()
            if host.numel():
                self.file.write(_as_bytes(host))
            self.entries.append((offset, host.shape, host.dtype))
            offset += host.numel() * host.element_size()
        self.file.flush()
        self.nbytes = offset

    def load(self, i: int, device: torch.device) -> torch.Tensor:
        """Entry `i`, read into a new tensor on `device` (through host memory for a non-CPU device)."""
        offset, shape, dtype = self.entries[i]
        out = torch.empty(shape, dtype=dtype, device="cpu", pin_memory=device.type == "cuda")
        view, done, fd = _as_bytes(out), 0, self.file.fileno()
        while done < len(view):                                            # pread may return short
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"ref_offload: the reference's weight file ended at byte {offset + done}")
            done += got
        return out if device.type == "cpu" else out.to(device, non_blocking=True)


class HostStore:
    """Tensors kept in host memory (pinned when they go to a CUDA device), copied to the device at each load."""

    def __init__(self, tensors, directory: str | None = None, pin: bool | None = None):
        tensors = list(tensors)
        if pin is None:                                                      # they come back to a GPU
            pin = any(t.device.type == "cuda" for t in tensors)
        self.tensors = [t.detach().to("cpu").clone(memory_format=torch.contiguous_format) for t in tensors]
        if pin:
            self.tensors = [t.pin_memory() for t in self.tensors]
        self.nbytes = tensor_bytes(self.tensors)

    def load(self, i: int, device: torch.device) -> torch.Tensor:
        t = self.tensors[i]
        return t.clone() if device.type == "cpu" else t.to(device, non_blocking=True)


#: `train.ref_offload` -> its store (``none`` keeps the module as it is; ``auto`` is resolved by the runtime).
STORES = {"disk": DiskStore, "cpu": HostStore}


class Offloaded:
    """A module whose parameters live in a store between uses.

    Building it moves every parameter's data into the store (`mode` disk | cpu) and leaves an empty tensor of the
    same dtype on the same device in its place; :meth:`resident` puts the data back for a block.
    `sources` (one tensor per parameter of ``unique_parameters(module)``, None = the parameters' own data): the
    values to store instead, cast to each parameter's dtype one tensor at a time on the way to host memory, so
    a module built hollow (:func:`hollow_copy`) never holds its weights on the device.
    """

    def __init__(self, module: torch.nn.Module, mode: str, directory: str | None = None, sources=None):
        if mode not in STORES:
            raise ValueError(f"train.ref_offload: no store '{mode}' (expected one of {', '.join(STORES)})")
        self.module = module
        self.params = unique_parameters(module)
        self.devices = [p.device for p in self.params]
        if sources is None:
            data = [p.data for p in self.params]
        else:
            data = (src.detach().to(device="cpu", dtype=p.dtype) for src, p in zip(sources, self.params, strict=True))
        self.store = STORES[mode](data, directory, pin=any(d.type == "cuda" for d in self.devices))
        self.nbytes = self.store.nbytes
        self._release()

    def _release(self) -> None:
        for p, device in zip(self.params, self.devices):
            p.data = torch.empty(0, dtype=p.dtype, device=device)

    @contextlib.contextmanager
    def resident(self):
        """The module with its stored weights in place for the block, emptied again when it ends."""
        try:
            for i, (p, device) in enumerate(zip(self.params, self.devices)):
                p.data = self.store.load(i, device)
            yield self.module
        finally:
            self._release()


def hollow_copy(module: torch.nn.Module) -> tuple[torch.nn.Module, dict[str, torch.nn.Parameter]]:
    """A deep copy of `module` whose parameters are empty tensors (same dtype and device, no grad), and the
    original parameters by qualified name (ties included): the copy's structure, buffers and hooks without a
    second set of weights, for :class:`Offloaded` to fill its store from the originals (``sources``). A plain
    ``copy.deepcopy`` holds both sets of weights on the device until the copy is offloaded."""
    params = unique_parameters(module)
    memo = {id(p): torch.nn.Parameter(torch.empty(0, dtype=p.dtype, device=p.device), requires_grad=False)
            for p in params}
    return copy.deepcopy(module, memo), dict(module.named_parameters(remove_duplicate=False))


def sources_by_name(module: torch.nn.Module, originals: dict[str, torch.nn.Parameter]) -> list[torch.Tensor]:
    """For each of ``unique_parameters(module)`` (a hollow copy, perhaps with parameters since replaced), the
    original parameter of the same qualified name (its first name, for a tied one)."""
    first: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), name)
    return [originals[first[id(p)]] for p in unique_parameters(module)]
