"""One serial call of each elementwise math function torch may route to oneMKL's VML, before any parallel call.

oneMKL picks each VML function's kernel (per dtype) on its first call. When that first call is made by
several intra-op threads at once, one thread's chunk can run a low-accuracy kernel: on this project's
2-core hosts (torch 2.13 CPU wheel), a fresh process's first ``cos`` of a [16, 12, 32] float32 tensor at 2
threads came out wrong by up to 1.5e-4 in half its elements in 45 of 150 processes (exact to 3e-8 in the
others and in all 100 processes that had made one serial call first). The first victim was the rotary
embedding of the rollout's first prefill: step 1's sampling log-probs differed between two identical runs
(and could, in principle, change the tokens drawn). The warm-up costs a few microseconds once per process.
Reported upstream as a first-call dispatch race of oneMKL 2024.2 (pytorch/pytorch#188792).
"""

from __future__ import annotations

import functools

import torch

#: The unary ops that ATen's CPU kernels may hand to VML (aten/src/ATen/cpu/vml.h), plus their close kin.
OPS = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "erfinv", "exp", "expm1", "floor",
       "lgamma", "log", "log10", "log1p", "log2", "reciprocal", "round", "rsqrt", "sigmoid", "sin", "sinh",
       "sqrt", "tan", "tanh", "trunc")


@functools.lru_cache(maxsize=None)
def warm_vml() -> tuple[str, ...]:
    """Call every op of :data:`OPS` once on a one-element CPU tensor (serial: below every parallel grain)
    in float32 and float64; returns the ops called. Runs once per process."""
    done = []
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            x = torch.full((1,), 0.5, dtype=dtype, device="cpu")
            for name in OPS:
                getattr(torch, name)(x)
                done.append(f"{name}:{str(dtype).removeprefix('torch.')}")
    return tuple(done)
