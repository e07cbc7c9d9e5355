"""The runtime of one device: where the policy lives and the tuning that only that device wants.

Decided once per run, from `model.device` (auto | cpu | cuda | cuda:N; auto = CUDA when available;
under torchrun `cuda:LOCAL_RANK`), by :func:`build_runtime`. Every device-specific choice of a run
goes through the object it returns, so the loop and its stages stay device-neutral:

=====================  ==========================================  ====================================
                       CpuRuntime                                  CudaRuntime
=====================  ==========================================  ====================================
process set-up         glibc mmap threshold, torch thread count    torch.cuda.set_device
placing the policy     oneDNN float32 linears (`model.cpu_matmul`)  ``model.to(device)``
                       or in-place weight gradients (one process,
                       `train.grad_in_place`)
micro-batch tokens     auto: 2**20 / (hidden x layers), >= 256     auto: a quarter of free memory / the
                                                                   per-token activation estimate
memory budget          auto: RSS + 80% of min(MemAvailable,           auto: allocated + 80% of
                       cgroup room) (`train.memory_budget_gib`)    mem_get_info's free memory
attention kernel       as loaded (sdpa)                            `model.attn_implementation`
memory metric          none (bench/memory.py measures RSS)         memory/peak_allocated_gib (per step)
reference weights      auto: in a file between reference passes    auto: on the device
                       when >= 64 MiB (`train.ref_offload`)
=====================  ==========================================  ====================================

The CUDA runtime is written against torch's documented CUDA API but could not be run here (no GPU
on this project's machines): docs/python-api.md says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from grpo.config import Config, ConfigError
from grpo.modeling.models import model_device  # noqa: F401  (also a name of this module)

#: Values `model.attn_implementation` accepts (auto = sdpa, or flash_attention_2 when installed on CUDA).
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2")


def local_rank() -> int:
    """This process's GPU index under torchrun (LOCAL_RANK), 0 otherwise."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(spec: str, cuda_available: bool | None = None, rank: int | None = None) -> torch.device:
    """`model.device` as a torch device: auto -> cuda:LOCAL_RANK when CUDA is available, else cpu;
    cuda -> cuda:LOCAL_RANK; cuda:N and cpu as given. A CUDA device without CUDA is a ConfigError."""
    cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
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
class CpuRuntime:
    """CPU: every CPU-only tuning of the project lives here and nowhere else."""

    device: torch.device
    cfg: Config

    def prepare_process(self) -> None:
        """Allocator settings, thread count, oneMKL's math kernels and grpo's native kernels (process-wide)."""
        from grpo.modeling import heap, native_gemm
        from grpo.modeling.vml_warmup import warm_vml

        heap.configure(self.cfg.train.mmap_threshold_mb, self.cfg.train.huge_pages)   # glibc; the gradient buffer
        if self.cfg.train.num_threads:
            torch.set_num_threads(self.cfg.train.num_threads)
        warm_vml()           # before any parallel first call of cos, exp, ...: see grpo/modeling/vml_warmup.py
        native_gemm.configure(self.cfg.rollout.decode_kernel, self.cfg.train.grad_kernel,     # built on first use
                              self.cfg.train.elementwise_kernel, self.cfg.train.attention_kernel)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The policy on the CPU with oneDNN float32 linears where they are faster (`model.cpu_matmul`), the others
        accumulating their weight gradients in place in a single process (`train.grad_in_place`)."""
        from grpo.modeling.cpu_kernels import use_cpu_matmul
        from grpo.modeling.native_attention import use_native_attention
        from grpo.training.distributed import env_world_size

        if model_device(model) != self.device:
            model.to(self.device)
        use_cpu_matmul(model, self.cfg.model.cpu_matmul, self.cfg.train.grad_in_place and env_world_size() == 1)
        use_native_attention(model)                  # sdpa's short float32 calls by grpo's kernel (train.attention_kernel)
        return model

    def micro_batch_tokens(self, model: torch.nn.Module) -> int:
        """`train.micro_batch_tokens` (0 = auto: grpo.training.update.auto_micro_batch_tokens, the CPU heuristic)."""
        from grpo.training.update import micro_batch_tokens

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
        in one flat buffer (`train.grad_buffer`) in a single process: DDP and FSDP2 manage their own."""
        from grpo.training.distributed import env_world_size

        plan = plan_for(self, model, prompt_tokens, optimizer, engine)
        return replace(plan, grad_buffer=self.cfg.train.grad_buffer and env_world_size() == 1)

    def ref_offload(self, model: torch.nn.Module) -> str:
        """`train.ref_offload` for this run; auto = disk for a full reference copy of >= REF_OFFLOAD_MIN_BYTES."""
        return resolve_ref_offload(self.cfg, model, "disk")

    def release_memory(self) -> None:
        """`train.malloc_trim`: the heap's free pages back to the OS (glibc); the loop calls it once per step, between
        the experience (rollout, reference pass) and the update."""
        from grpo.modeling.heap import release_free_heap

        if self.cfg.train.malloc_trim:
            release_free_heap()

    def reset_memory_stats(self) -> None:
        pass

    def memory_metrics(self) -> dict[str, float]:
        """None on CPU: the process's peak RSS is not a per-step quantity (bench/memory.py measures it)."""
        return {}


@dataclass
class CudaRuntime:
    """One CUDA device: the policy, the reference and every tensor of the step on it. Not run here (no GPU)."""

    device: torch.device
    cfg: Config

    def prepare_process(self) -> None:
        torch.cuda.set_device(self.device)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        model.to(self.device)
        return model

    def micro_batch_tokens(self, model: torch.nn.Module) -> int:
        """`train.micro_batch_tokens`; 0 = auto: a quarter of the free device memory divided by the activation
        estimate of grpo.training.update.auto_micro_batch_tokens (36 x hidden x layers values per token, 2 or 4 bytes)."""
        configured = self.cfg.train.micro_batch_tokens
        if configured != 0:
            return configured
        free, _ = torch.cuda.mem_get_info(self.device)
        per_value = 2 if getattr(self.cfg.train, "precision", "fp32") in ("bf16", "fp16") else 4
        return max(1024, activation_tokens(model, free // 4 // (36 * per_value)))

    def memory_in_use(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def memory_budget(self) -> int:
        """`train.memory_budget_gib`, or 0 = auto: allocated plus SAFE_SHARE of torch.cuda.mem_get_info's free memory."""
        return configured_budget(self.cfg) or self.memory_in_use() + int(SAFE_SHARE * torch.cuda.mem_get_info(self.device)[0])

    def memory_plan(self, model: torch.nn.Module, prompt_tokens: int, optimizer=None, engine: str = "native"):
        return plan_for(self, model, prompt_tokens, optimizer, engine)

    def ref_offload(self, model: torch.nn.Module) -> str:
        """`train.ref_offload` for this run; auto = none (the reference stays on the device)."""
        return resolve_ref_offload(self.cfg, model, "none")

    def release_memory(self) -> None:
        """Nothing: the caching allocator keeps device memory for reuse, and the host's heap is not the limit."""

    def reset_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def memory_metrics(self) -> dict[str, float]:
        """Peak memory allocated by tensors during the step, in GiB."""
        return {"memory/peak_allocated_gib": torch.cuda.max_memory_allocated(self.device) / 2 ** 30}


RUNTIMES = {"cpu": CpuRuntime, "cuda": CudaRuntime}

#: `train.ref_offload: auto` offloads a reference copy of at least this many bytes (a smaller one saves less
#: than the runtime's own run-to-run spread in peak RSS).
REF_OFFLOAD_MIN_BYTES = 64 * 2 ** 20


def resolve_ref_offload(cfg: Config, model: torch.nn.Module, auto_choice: str) -> str:
    """`train.ref_offload` as given, or for auto: `auto_choice` when the run builds a full frozen reference copy
    (beta > 0, no LoRA, algorithm.ref_update_steps = 0) of at least REF_OFFLOAD_MIN_BYTES, else none."""
    from grpo.modeling.lora import is_lora
    from grpo.modeling.offload import tensor_bytes, unique_parameters

    mode = cfg.train.ref_offload
    if mode != "auto":
        return mode
    full_copy = cfg.algorithm.beta > 0 and not cfg.algorithm.ref_update_steps and not is_lora(model)
    return auto_choice if full_copy and tensor_bytes(unique_parameters(model)) >= REF_OFFLOAD_MIN_BYTES else "none"

#: The share of the memory still available that the default budget (`train.memory_budget_gib = 0`) may use:
#: the rest is left to the other processes, the page cache and the estimate's error.
SAFE_SHARE = 0.8


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


def configured_budget(cfg: Config) -> int:
    """`train.memory_budget_gib` in bytes (0 = auto)."""
    return int(cfg.train.memory_budget_gib * 2 ** 30)


def model_shape(model: torch.nn.Module, act_bytes: int, compute_dtype: torch.dtype | None = None,
                offloaded_ref: bool = False, rollout_dtype: torch.dtype | None = None):
    """The planner's view of a policy (grpo.training.memory_plan.ModelShape) from its config and parameters;
    `compute_dtype`: autocast's dtype (`train.precision`), None for the parameters' own; `offloaded_ref`: the
    reference's weights (counted at the policy's size) are loaded for the reference phase (`train.ref_offload`);
    `rollout_dtype`: autocast's dtype in the rollout when `rollout.precision` differs from `train.precision`."""
    from grpo.modeling.offload import tensor_bytes, unique_parameters
    from grpo.modeling.cpu_kernels import can_prepack
    from grpo.modeling.lean_layers import lean_mlps
    from grpo.training.memory_plan import ModelShape, runtime_allowance

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    c = getattr(inner, "config", None)
    c = c.get_text_config() if hasattr(c, "get_text_config") else c
    hidden = int(getattr(c, "hidden_size", 0) or 0)
    heads = int(getattr(c, "num_attention_heads", 1) or 1)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    return ModelShape(hidden=hidden, intermediate=int(getattr(c, "intermediate_size", 0) or 4 * hidden),
                      layers=int(getattr(c, "num_hidden_layers", 0) or 0),
                      kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                      head_dim=int(getattr(c, "head_dim", None) or hidden // heads),
                      vocab=int(getattr(c, "vocab_size", 0) or 0),
                      trainable_params=n_trainable, slack_bytes=runtime_allowance(n_trainable),
                      param_bytes=trainable[0].element_size() if trainable else 4, act_bytes=act_bytes,
                      lean_layers=act_bytes == 4 and lean_mlps(model) > 0,
                      packed_rollout=bool(trainable) and can_prepack(trainable[0].device,
                                                                     rollout_dtype or compute_dtype or trainable[0].dtype),
                      rollout_bytes=rollout_dtype.itemsize if rollout_dtype is not None else 0,
                      offloaded_ref_bytes=tensor_bytes(unique_parameters(model)) if offloaded_ref else 0)


def step_shape(cfg: Config, prompt_tokens: int, engine: str = "native"):
    """The planner's view of one step (grpo.training.memory_plan.StepShape): B prompts of up to `prompt_tokens`
    tokens, k completions each (gfpo_sample_size or G), max_new_tokens long; under `engine` vllm the rollout's cache
    is vLLM's (reserved at its start, in use when the plan is made; or in a server): not counted again."""
    from grpo.training.memory_plan import StepShape

    k = cfg.algorithm.gfpo_sample_size or cfg.rollout.num_generations
    return StepShape(rows=cfg.train.prompts_per_step * k, prompts=cfg.train.prompts_per_step,
                     prompt_tokens=prompt_tokens, new_tokens=cfg.rollout.max_new_tokens, own_rollout=engine != "vllm")


def plan_for(runtime, model: torch.nn.Module, prompt_tokens: int, optimizer=None, engine: str = "native"):
    """The memory plan of `runtime`'s run (grpo.training.memory_plan.plan_memory) for prompts of up to
    `prompt_tokens` tokens: the configured settings, what is in use now and the budget. The planner counts AdamW's
    moments itself, so `optimizer`'s state already in memory (made up front, or a resumed run's) is taken out of
    what is in use."""
    from grpo.modeling.precision import autocast_dtype, rollout_precision
    from grpo.training.memory_plan import plan_memory
    from grpo.training.update import state_bytes

    cfg = runtime.cfg
    lowp = autocast_dtype(cfg.train.precision)
    rollout = rollout_precision(cfg.rollout.precision, cfg.train.precision)
    rollout_dtype = (autocast_dtype(rollout) or torch.float32) if rollout != cfg.train.precision else None
    shape = model_shape(model, 2 if lowp is not None else 4, lowp, runtime.ref_offload(model) != "none", rollout_dtype)
    in_use = runtime.memory_in_use() - state_bytes(optimizer, runtime.device)
    return plan_memory(shape, step_shape(cfg, prompt_tokens, engine), in_use=in_use,
                       budget=runtime.memory_budget(), auto_tokens=runtime.micro_batch_tokens(model),
                       micro_batch_tokens=cfg.train.micro_batch_tokens,
                       gradient_checkpointing=cfg.train.gradient_checkpointing,
                       logprob_chunk_size=cfg.train.logprob_chunk_size,
                       logprob_micro_batch_tokens=cfg.train.logprob_micro_batch_tokens)


def build_runtime(cfg: Config, model: torch.nn.Module | None = None) -> CpuRuntime | CudaRuntime:
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
    place_reward_models(rewards, device)
    return model.to(device)
