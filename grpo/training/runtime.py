"""The runtime of one device: where the policy lives and the tuning that only that device wants.

Decided once per run, from `model.device` (auto | cpu | cuda | cuda:N; auto = CUDA when available;
under torchrun `cuda:LOCAL_RANK`), by :func:`build_runtime`. Every device-specific choice of a run
goes through the object it returns, so the loop and its stages stay device-neutral:

=====================  ==========================================  ====================================
                       CpuRuntime (grpo.training.cpu_runtime)      CudaRuntime
=====================  ==========================================  ====================================
process set-up         glibc mmap threshold, torch thread count,   torch.cuda.set_device; grpo's native
                       native kernels (the `cpu` config section)   CPU kernels off, plain model hooks
placing the policy     oneDNN float32 linears (`cpu.cpu_matmul`)    ``model.to(device)``
                       or in-place weight gradients (one process,
                       `cpu.grad_in_place`), grpo.cpu's hooks
micro-batch tokens     auto: 2**20 / (hidden x layers), >= 256     auto: a quarter of free memory / the
                                                                   per-token activation estimate
memory budget          auto: RSS + 80% of min(MemAvailable,           auto: allocated + 80% of
                       cgroup room) (`train.memory_budget_gib`)    mem_get_info's free memory
attention kernel       sdpa's short calls by grpo's (grpo_native)  `model.attn_implementation`
memory metric          none (bench/memory.py measures RSS)         memory/peak_allocated_gib (per step)
reference weights      auto: in a file between reference passes    auto: on the device
                       when >= 64 MiB (`train.ref_offload`)
=====================  ==========================================  ====================================

The CUDA runtime is written against torch's documented CUDA API but could not be run here (no GPU
on this project's machines): docs/python-api.md says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from grpo.accelerator import accelerator
from grpo.config import Config, ConfigError
from grpo.modeling.models import model_device  # noqa: F401  (also a name of this module)
from grpo.training.cpu_runtime import (CpuRuntime, available_host_memory, cgroup_room,  # noqa: F401  (also here)
                                       meminfo_available, resident_bytes)
from grpo.training.runtime_plan import (REF_OFFLOAD_MIN_BYTES, SAFE_SHARE, configured_budget,  # noqa: F401
                                        model_shape, plan_for, resolve_ref_offload, step_shape)

#: Values `model.attn_implementation` accepts (auto = sdpa, or flash_attention_2 when installed on CUDA).
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2")


def local_rank() -> int:
    """This process's GPU index under torchrun (LOCAL_RANK), 0 otherwise."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(spec: str, cuda_available: bool | None = None, rank: int | None = None) -> torch.device:
    """`model.device` as a torch device: auto -> cuda:LOCAL_RANK when CUDA is available, else cpu;
    cuda -> cuda:LOCAL_RANK; cuda:N and cpu as given. A CUDA device without CUDA is a ConfigError."""
    cuda_available = accelerator("cuda").is_available() if cuda_available is None else cuda_available
    rank = local_rank() if rank is None else rank
    spec = spec.strip().lower()
    if spec == "auto":
        spec = "cuda" if cuda_available else "cpu"
    if spec == "cuda":
        spec = f"cuda:{rank}"
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"model.device must be auto | cpu | cuda | cuda:N, got '{spec}'") from None
    if device.type not in RUNTIMES:
        raise ConfigError(f"model.device must be auto | cpu | cuda | cuda:N, got '{spec}'")
    if device.type == "cuda" and not cuda_available:
        raise ConfigError(f"model.device={spec}: CUDA is not available on this machine (torch "
                          f"{torch.__version__}); use model.device=cpu or auto")
    return device


def activation_tokens(model: torch.nn.Module, budget: int) -> int:
    """Tokens per micro-batch so that tokens x hidden_size x layers ~= `budget` (4096 without a config)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    width = getattr(config, "hidden_size", 0) * getattr(config, "num_hidden_layers", 0)
    return budget // width if width else 4096


@dataclass
class CudaRuntime:
    """One CUDA device: the policy, the reference and every tensor of the step on it. Every ``torch.cuda`` call goes
    through `accel` (grpo.accelerator): on the ``meta`` device (:func:`meta_runtime`) the same code runs without a GPU."""

    device: torch.device
    cfg: Config
    accel: Any = None                 # None: the accelerator of `device` (CudaAccelerator; MetaAccelerator on meta)

    def __post_init__(self):
        self.accel = accelerator(self.device) if self.accel is None else self.accel

    def prepare_process(self) -> None:
        """The device, and grpo's native CPU kernels off (never built or loaded here) with plain model hooks."""
        from grpo.training.cpu_runtime import native_kernels_off

        native_kernels_off()
        self.accel.set_device(self.device)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The policy on the device; the lean layers only when `train.lean_layers` is true (auto is a CPU choice)."""
        from grpo.modeling.lean_layers import use_lean_layers

        model.to(self.device)
        use_lean_layers(model, bool(self.cfg.train.lean_layers))
        return model

    def micro_batch_tokens(self, model: torch.nn.Module) -> int:
        """`train.micro_batch_tokens`; 0 = auto: a quarter of the free device memory divided by the activation
        estimate of grpo.training.cpu_runtime.auto_micro_batch_tokens (36 x hidden x layers values per token, 2 or 4 bytes)."""
        configured = self.cfg.train.micro_batch_tokens
        if configured != 0:
            return configured
        free, _ = self.accel.mem_get_info(self.device)
        per_value = 2 if getattr(self.cfg.train, "precision", "fp32") in ("bf16", "fp16") else 4
        return max(1024, activation_tokens(model, free // 4 // (36 * per_value)))

    def memory_in_use(self) -> int:
        return self.accel.memory_allocated(self.device)

    def memory_budget(self) -> int:
        """`train.memory_budget_gib`, or 0 = auto: allocated plus SAFE_SHARE of torch.cuda.mem_get_info's free memory."""
        return configured_budget(self.cfg) or self.memory_in_use() + int(SAFE_SHARE * self.accel.mem_get_info(self.device)[0])

    def memory_plan(self, model: torch.nn.Module, prompt_tokens: int, optimizer=None, engine: str = "native"):
        return plan_for(self, model, prompt_tokens, optimizer, engine)

    def ref_offload(self, model: torch.nn.Module) -> str:
        """`train.ref_offload` for this run; auto = none (the reference stays on the device)."""
        return resolve_ref_offload(self.cfg, model, "none")

    def release_memory(self) -> None:
        """Nothing: the caching allocator keeps device memory for reuse, and the host's heap is not the limit."""

    def reset_memory_stats(self) -> None:
        self.accel.reset_peak_memory_stats(self.device)

    def memory_metrics(self) -> dict[str, float]:
        """Peak memory allocated by tensors during the step, in GiB."""
        return {"memory/peak_allocated_gib": self.accel.max_memory_allocated(self.device) / 2 ** 30}


def meta_runtime(cfg: Config, accel=None) -> CudaRuntime:
    """The CUDA runtime with ``meta`` standing in for the GPU (tests; grpo.accelerator.MetaAccelerator): the policy
    and every step tensor on meta, values absent, a CPU tensor meeting them an error."""
    return CudaRuntime(torch.device("meta"), cfg, accel or accelerator("meta"))


RUNTIMES = {"cpu": CpuRuntime, "cuda": CudaRuntime}   # CpuRuntime: imported above from grpo.training.cpu_runtime

def build_runtime(cfg: Config, model: torch.nn.Module | None = None):
    """The runtime of `model.device` (see the module docstring)."""
    device = resolve_device(cfg.model.device)
    return RUNTIMES[device.type](device, cfg)


#: the weight dtypes flash-attention computes in (it refuses float32 inputs)
FLASH_DTYPES = (torch.bfloat16, torch.float16)


def attn_implementation(spec: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str | None:
    """The attention kernel to load a model with: None = the library's choice (sdpa) for `auto` off CUDA;
    for `auto` on CUDA flash_attention_2 when the package is installed and the weights (`dtype`) are bf16 /
    fp16 (flash-attention has no float32 kernel; outside autocast it would get float32 inputs), else sdpa;
    otherwise as configured, flash_attention_2 with float32 weights being a ConfigError."""
    if spec not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(f"model.attn_implementation must be one of {' | '.join(ATTN_IMPLEMENTATIONS)}, got '{spec}'")
    if spec.startswith("flash_attention") and dtype not in FLASH_DTYPES:
        raise ConfigError(f"model.attn_implementation={spec} needs bfloat16 or float16 weights (model.dtype), "
                          f"got {str(dtype).removeprefix('torch.')}; use sdpa with float32 weights")
    if spec != "auto":
        return spec
    if device.type == "cuda":
        from transformers.utils import is_flash_attn_2_available

        return "flash_attention_2" if is_flash_attn_2_available() and dtype in FLASH_DTYPES else "sdpa"
    return None


def set_attn_implementation(model: torch.nn.Module, spec: str, device: torch.device) -> None:
    """Switch a loaded model's attention kernel (`model.attn_implementation`, chosen for the dtype of its
    weights); no-op for `auto` off CUDA."""
    param = next(model.parameters(), None)
    chosen = attn_implementation(spec, device, torch.float32 if param is None else param.dtype)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if chosen is None or getattr(getattr(inner, "config", None), "_attn_implementation", None) == chosen:
        return
    if not hasattr(inner, "set_attn_implementation"):
        raise ConfigError(f"model.attn_implementation={spec}: {type(inner).__name__} cannot switch its attention kernel")
    try:
        inner.set_attn_implementation(chosen)
    except (ValueError, ImportError) as e:
        raise ConfigError(f"model.attn_implementation={chosen}: {str(e).strip().splitlines()[0]}") from None



def on_device(model: torch.nn.Module, rewards: list, spec: str) -> torch.nn.Module:
    """`model` and the reward models among `rewards` ((name, fn) pairs) moved to the device `spec` names
    (`model.device`'s values; `grpo eval` / `grpo sample --device`). Returns the model."""
    from grpo.rewards.reward_model import place_reward_models

    device = resolve_device(spec)
    if device.type == "cpu":               # the CPU's model hooks (oneDNN / native decode), as a training run has
        from grpo.training.cpu_runtime import install_hooks

        install_hooks()
    place_reward_models(rewards, device)
    return model.to(device)
