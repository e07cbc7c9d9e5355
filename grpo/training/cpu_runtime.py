"""The CPU runtime: every CPU-only tuning of a run, and the only module of grpo that imports grpo.cpu.

=====================  ============================================================================================
process set-up         glibc mmap threshold and huge pages (`cpu.mmap_threshold_mb`, `cpu.huge_pages`), torch's thread
                       count (`cpu.num_threads`), oneMKL's VML warm-up, the native kernels' modes (`cpu.*_kernel`)
placing the policy     oneDNN float32 linears (`cpu.cpu_matmul`) or in-place weight gradients (one process,
                       `cpu.grad_in_place`), grpo's native attention (`cpu.attention_kernel`), lean layers
                       (`train.lean_layers`, auto: on with oneDNN MLPs), and the model-code hooks (grpo.cpu.hooks)
micro-batch tokens     auto: 2**20 / (hidden x layers), >= :func:`token_floor` (256, more with lean layers)
memory budget          auto: RSS + 80% of min(MemAvailable, cgroup room) (`train.memory_budget_gib`)
between phases         the heap's free pages back to the OS (`cpu.malloc_trim`)
update                 gradients in one flat buffer in a single process (`cpu.grad_buffer`)
=====================  ============================================================================================

Timings quoted here and in grpo.cpu were measured on this project's hosts (2-core AMD EPYC Zen 5 VMs with AVX-512,
an Intel Xeon with AMX); docs/performance.md has the tables. What both runtimes share (the memory plan's inputs,
the budget arithmetic) is in grpo.training.runtime_plan; the host-memory readings are here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from grpo.config import Config
from grpo.modeling.models import model_device
from grpo.training.runtime_plan import SAFE_SHARE, configured_budget, plan_for, resolve_ref_offload


def install_hooks():
    """Put grpo.cpu's model-code hooks in force (grpo.modeling.hooks.install; idempotent). Returns them."""
    from grpo.cpu.hooks import CpuHooks
    from grpo.modeling.hooks import install, installed

    if not isinstance(installed(), CpuHooks):
        install(CpuHooks())
    return installed()


def warm_vml() -> tuple[str, ...]:
    """oneMKL's VML functions called once serially before any parallel first call (grpo.cpu.vml_warmup; once per
    process): every command runs it, `grpo eval` and `grpo sample` run the model without a training runtime."""
    from grpo.cpu.vml_warmup import warm_vml as warm

    return warm()


def native_kernels_off() -> None:
    """For the other runtimes: every native kernel mode off (the library is then never built or loaded, the modes
    being checked after the tensors' device anyway) and the plain model-code hooks back in force."""
    from grpo.cpu import native_gemm
    from grpo.modeling.hooks import install

    native_gemm.configure("onednn", "onednn", "torch", "torch")
    install(None)


def auto_micro_batch_tokens(model: torch.nn.Module, budget: int = 2 ** 20) -> int:
    """`train.micro_batch_tokens = 0`: tokens per micro-batch so that tokens x hidden_size x layers is
    about `budget`, at least :func:`token_floor` (256); 4096 when the config does not say. A Qwen2-style layer keeps
    about 36 x hidden_size float32 values per token for its backward pass (measured), so 2**20 is ~150 MiB of
    activations. E.g. 2048 tokens at hidden 128 x 4 layers (the embedded model), the floor for any model with
    hidden x layers >= 4096. On the embedded task 2048 was 10 % faster per step than 1024 (fewer calls, more rows
    per shared prompt; +57 MiB) and 4096 80 % slower (cache misses)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    width = getattr(config, "hidden_size", 0) * getattr(config, "num_hidden_layers", 0)
    return max(token_floor(model, config), budget // width) if width else 4096


def token_floor(model: torch.nn.Module, config) -> int:
    """The auto micro-batch's floor: 256 tokens, or with `train.lean_layers` active the tokens whose stored activations
    equal 256 tokens' of stock layers (grpo.training.memory_plan's per-token values: ~400 on Qwen2 shapes), so the
    lean layers' saving buys fewer, larger micro-batches at the same memory. Measured on an AMD EPYC Zen 5
    (forward+backward of 16 rows x 75 tokens, 5 alternating passes, bench shapes): hidden 768 x 12 layers,
    2.64 s stock at 256 tokens (6 micro-batches) against 2.41 s lean at 300 (4); 7.68 against 7.13 s at hidden 1024 x
    24. Without lean layers the floor stays 256: with `cpu.mmap_threshold_mb` 1 (the old default) 384-token
    micro-batches made qwen2-100m's update slower (8.5-8.9 s against 7.7-7.8 s), and larger ones cost peak memory
    that grid points such as vocab256 do not have (docs/performance.md)."""
    from grpo.modeling.lean_layers import lean_mlps
    from grpo.training.memory_plan import layer_values

    hidden, inter = getattr(config, "hidden_size", 0), getattr(config, "intermediate_size", 0)
    if not (hidden and inter and lean_mlps(model)):
        return 256
    return int(256 * layer_values(hidden, inter, False) / layer_values(hidden, inter, True))


def micro_batch_tokens(tokens: int, model: torch.nn.Module) -> int:
    """`train.micro_batch_tokens`, with 0 resolved from the model's size (:func:`auto_micro_batch_tokens`)."""
    return auto_micro_batch_tokens(model) if tokens == 0 else tokens


@dataclass
class CpuRuntime:
    """CPU: every CPU-only tuning of the project lives here and nowhere else (the module docstring's table)."""

    device: torch.device
    cfg: Config

    def prepare_process(self) -> None:
        """Allocator settings, thread count, oneMKL's math kernels, grpo's native kernels (process-wide) and the
        model-code hooks."""
        from grpo.cpu import heap, native_gemm
        from grpo.cpu.vml_warmup import warm_vml

        c = self.cfg.cpu
        heap.configure(c.mmap_threshold_mb, c.huge_pages)       # glibc; the gradient buffer
        if c.num_threads:
            torch.set_num_threads(c.num_threads)
        warm_vml()           # before any parallel first call of cos, exp, ...: see grpo/cpu/vml_warmup.py
        native_gemm.configure(c.decode_kernel, c.grad_kernel, c.elementwise_kernel, c.attention_kernel)   # built on first use
        install_hooks()

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The policy on the CPU with oneDNN float32 linears where they are faster (`cpu.cpu_matmul`), the others
        accumulating their weight gradients in place in a single process (`cpu.grad_in_place`), grpo's attention
        kernel for sdpa's short float32 calls (`cpu.attention_kernel`) and the lean layers (`train.lean_layers`).
        The linears' classes are swapped here (grpo.cpu.placement), on grpo's own model only."""
        from grpo.cpu.native_attention import use_native_attention
        from grpo.cpu.placement import resolve_lean_layers, use_cpu_matmul
        from grpo.modeling.lean_layers import use_lean_layers
        from grpo.training.distributed import env_world_size

        install_hooks()
        if model_device(model) != self.device:
            model.to(self.device)
        one_process = env_world_size() == 1
        use_cpu_matmul(model, self.cfg.cpu.cpu_matmul, self.cfg.cpu.grad_in_place and one_process)
        use_native_attention(model)
        use_lean_layers(model, resolve_lean_layers(self.cfg.train.lean_layers, model, env_world_size()))
        return model

    def micro_batch_tokens(self, model: torch.nn.Module) -> int:
        """`train.micro_batch_tokens` (0 = auto: :func:`auto_micro_batch_tokens`, the CPU heuristic)."""
        return micro_batch_tokens(self.cfg.train.micro_batch_tokens, model)

    def memory_in_use(self) -> int:
        """Bytes this process holds now: its resident set (/proc/self/statm)."""
        return resident_bytes()

    def memory_budget(self) -> int:
        """`train.memory_budget_gib`, or 0 = auto: what is in use plus SAFE_SHARE of the memory still
        available to the process (the smaller of /proc/meminfo's MemAvailable and the cgroup's room)."""
        return configured_budget(self.cfg) or self.memory_in_use() + int(SAFE_SHARE * available_host_memory())

    def memory_plan(self, model: torch.nn.Module, prompt_tokens: int, optimizer=None, engine: str = "native"):
        """The update's micro-batch tokens, checkpointing and LM-head chunk for the budget (grpo.training.memory_plan);
        `optimizer`: its state already in memory is not counted twice; `engine`: the rollout engine's name. Gradients
        in one flat buffer (`cpu.grad_buffer`) in a single process: DDP and FSDP2 manage their own."""
        from grpo.training.distributed import env_world_size

        plan = plan_for(self, model, prompt_tokens, optimizer, engine)
        return replace(plan, grad_buffer=self.cfg.cpu.grad_buffer and env_world_size() == 1)

    def ref_offload(self, model: torch.nn.Module) -> str:
        """`train.ref_offload` for this run; auto = disk for a full reference copy of >= REF_OFFLOAD_MIN_BYTES."""
        return resolve_ref_offload(self.cfg, model, "disk")

    def release_memory(self) -> None:
        """`cpu.malloc_trim`: the heap's free pages back to the OS (glibc); the loop calls it once per step, between
        the experience (rollout, reference pass) and the update."""
        from grpo.cpu import heap

        if self.cfg.cpu.malloc_trim:
            heap.release_free_heap()

    def reset_memory_stats(self) -> None:
        pass

    def memory_metrics(self) -> dict[str, float]:
        """None on CPU: the process's peak RSS is not a per-step quantity (bench/memory.py measures it)."""
        return {}


def meminfo_available(text: str) -> int | None:
    """MemAvailable of a /proc/meminfo text, in bytes (None when absent)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_room(limit: str, usage: str) -> int | None:
    """Bytes left under a cgroup memory limit (v2 memory.max / v1 memory.limit_in_bytes and the usage
    file); None when there is no limit ("max", or v1's near-2**63 "unlimited")."""
    limit = limit.strip()
    if limit == "max" or not limit.isdigit() or int(limit) >= 2 ** 60:
        return None
    return max(0, int(limit) - int(usage.strip()))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def available_host_memory() -> int:
    """Bytes this process may still take: the smaller of MemAvailable and the room under its cgroup's limit
    (v2, then v1); without /proc (not Linux), torch's view of free memory is unknown: 8 GiB is assumed."""
    candidates = [meminfo_available(_read("/proc/meminfo") or "")]
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        text, used = _read(limit), _read(usage)
        if text is not None and used is not None:
            candidates.append(cgroup_room(text, used))
    known = [c for c in candidates if c is not None]
    return min(known) if known else 8 * 2 ** 30


def resident_bytes() -> int:
    """This process's resident set now (/proc/self/statm), else its peak (getrusage) elsewhere."""
    statm = _read("/proc/self/statm")
    if statm:
        return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
