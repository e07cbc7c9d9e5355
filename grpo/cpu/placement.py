"""Where the CPU runtime places grpo's model on its kernels (`cpu.cpu_matmul`, `cpu.grad_in_place`,
`train.lean_layers` auto) and the calibration that decides it. Called from ``CpuRuntime.place`` only: swapping a
module's class (``module.__class__ = ...``) is done here, on grpo's own model, and nowhere else.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from grpo.cpu.grad_in_place import GradIntoEmbedding, GradIntoLinear
from grpo.cpu.kernels import PLAIN_LINEARS, DnnLinear, onednn_linear, onednn_works
from grpo.modeling.lean_layers import is_swiglu

MODES = ("auto", "onednn", "aten")


@functools.lru_cache(maxsize=None)
def onednn_speedup(threads: int) -> float:
    """Time ratio aten::mm / oneDNN on a [256, 1024] x [1024, 1024] product at `threads` threads
    (best of 5 each, alternated; ~40 ms)."""
    g = torch.Generator(device="cpu").manual_seed(0)       # a CPU calibration, whatever the default device
    x, w = torch.randn(256, 1024, generator=g, device="cpu"), torch.randn(1024, 1024, generator=g, device="cpu")
    best = {"aten": float("inf"), "dnn": float("inf")}
    for _ in range(5):
        for name, fn in (("aten", F.linear), ("dnn", onednn_linear)):
            t0 = time.perf_counter()
            fn(x, w)
            best[name] = min(best[name], time.perf_counter() - t0)
    return best["aten"] / best["dnn"]


#: `auto` leaves models narrower than this on aten: on the 128-wide embedded model oneDNN gave no
#: gain per training step (0.31 s update either way, with padded rows) and +70 MiB peak resident
#: memory for its kernels. The lean decoder uses oneDNN regardless (1.4-2x at decode shapes).
AUTO_MIN_WIDTH = 512


def should_switch(mode: str, width: int = AUTO_MIN_WIDTH) -> bool:
    """Whether `cpu.cpu_matmul = mode` switches the linears of a model of hidden size `width` to
    oneDNN on this machine."""
    if mode not in MODES:
        raise ValueError(f"cpu.cpu_matmul must be one of {' | '.join(MODES)}, got {mode!r}")
    if mode == "aten" or not onednn_works():
        return False
    return mode == "onednn" or (width >= AUTO_MIN_WIDTH and onednn_speedup(torch.get_num_threads()) >= 1.25)


def use_cpu_matmul(model: torch.nn.Module, mode: str = "auto", grad_in_place: bool = False) -> int:
    """Switch every ``nn.Linear`` of `model` to :class:`DnnLinear` (or back, when `mode` says no); with
    `grad_in_place`, the linears that stay on aten become :class:`GradIntoLinear`, the embeddings
    :class:`GradIntoEmbedding` (and back without), and the oneDNN linears add their autocast-cast weight's
    gradient into ``.grad`` in place (``DnnLinear.grad_into``).

    Returns the number of linear layers that now run through oneDNN. Parameters are untouched; only
    the class of each module changes, so state dicts, peft wrappers and checkpoints are unaffected.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    width = getattr(getattr(inner, "config", None), "hidden_size", AUTO_MIN_WIDTH)
    target = DnnLinear if should_switch(mode, width) else GradIntoLinear if grad_in_place else torch.nn.Linear
    embedding = GradIntoEmbedding if grad_in_place else torch.nn.Embedding
    switched = 0
    for module in model.modules():
        if type(module) in PLAIN_LINEARS:
            module.__class__ = target
            vars(module).pop("grad_into", None)           # a former DnnLinear's setting: the class's own applies
            switched += target is DnnLinear
            if target is DnnLinear:
                module.grad_into = grad_in_place
        elif type(module) in (torch.nn.Embedding, GradIntoEmbedding):
            module.__class__ = embedding
    return switched


def onednn_mlps(model: torch.nn.Module) -> bool:
    """Whether `model` has SwiGLU MLPs whose three projections all run through oneDNN (`cpu.cpu_matmul` switched
    them to DnnLinear): where `train.lean_layers` empty (auto) turns the lean layers on."""
    return any(is_swiglu(m) and all(type(getattr(m, n)) is DnnLinear for n in ("gate_proj", "up_proj", "down_proj"))
               for m in model.modules())


def resolve_lean_layers(setting: bool | None, model: torch.nn.Module, world_size: int = 1) -> bool:
    """`train.lean_layers`: true / false as set; None (auto) = on in one process when :func:`onednn_mlps`. Measured on
    an AMD EPYC Zen 5 (docs/performance.md): the update's forward+backward 5-7 % faster with lean layers at hidden
    768-1024 (oneDNN products), 2-4 % slower at hidden 128-256; on hosts whose products are MKL's it was neutral."""
    if setting is not None:
        return bool(setting)
    return world_size == 1 and onednn_mlps(model)
