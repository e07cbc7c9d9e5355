import re
"""The runtime per device: device resolution, CPU-only tuning on CPU only, the CUDA runtime's choices."""

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.modeling.models import build_model, build_tokenizer
from grpo.training.runtime import (CpuRuntime, CudaRuntime, activation_tokens, attn_implementation, build_runtime,
                          resolve_device, set_attn_implementation)


@pytest.mark.parametrize("spec, cuda, rank, expected", [
    ("auto", False, 0, "cpu"),
    ("auto", True, 0, "cuda:0"),
    ("auto", True, 3, "cuda:3"),        # torchrun: LOCAL_RANK picks the GPU
    ("cuda", True, 1, "cuda:1"),
    ("cuda:2", True, 0, "cuda:2"),
    ("cpu", True, 1, "cpu"),
    (" CPU ", False, 0, "cpu"),
])
def test_resolve_device(spec, cuda, rank, expected):
    assert resolve_device(spec, cuda_available=cuda, rank=rank) == torch.device(expected)


def test_cuda_without_cuda_and_bad_names_are_config_errors():
    with pytest.raises(ConfigError, match="model.device=cuda:0: CUDA is not available"):
        resolve_device("cuda", cuda_available=False, rank=0)
    with pytest.raises(ConfigError, match="model.device must be"):
        resolve_device("tpu", cuda_available=False, rank=0)
    with pytest.raises(ConfigError, match="model.device must be"):
        build_config(overrides={"model.device": "gpu"})


@pytest.mark.parametrize("setting", [True, False])
def test_cpu_runtime_trims_the_heap_between_phases_as_set_and_cuda_never(monkeypatch, setting):
    from grpo.cpu import heap

    calls = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: calls.append("trim") or True)
    cfg = build_config(overrides={"cpu.malloc_trim": setting})
    CpuRuntime(torch.device("cpu"), cfg).release_memory()
    assert calls == (["trim"] if setting else [])
    CudaRuntime(torch.device("cuda", 0), cfg).release_memory()      # no GPU call, no host trim
    assert calls == (["trim"] if setting else [])
    assert build_config().cpu.malloc_trim is True                  # on by default


def test_this_machine_builds_the_cpu_runtime():
    runtime = build_runtime(build_config())
    assert isinstance(runtime, CpuRuntime) and runtime.device == torch.device("cpu")


def test_cpu_tuning_applies_on_the_cpu_runtime_only(monkeypatch):
    import grpo.cpu.kernels as kernels
    from grpo.cpu import heap

    tok = build_tokenizer()
    cfg = build_config(overrides={"cpu.cpu_matmul": "onednn", "cpu.num_threads": 1, "train.lean_layers": False,
                                  "train.micro_batch_tokens": 0, "cpu.mmap_threshold_mb": 1})
    calls = []
    monkeypatch.setattr(heap, "set_mmap_threshold", lambda mb: calls.append(("mmap", mb)))
    monkeypatch.setitem(heap._huge_pages, "on", False)
    cpu = CpuRuntime(torch.device("cpu"), cfg)
    cpu.prepare_process()
    assert heap._huge_pages["on"]                                          # cpu.huge_pages (default true)
    model = cpu.place(build_model(tok, "micro"))
    assert ("mmap", 1) in calls and torch.get_num_threads() == 1
    if kernels.onednn_works():
        assert any(type(m) is kernels.DnnLinear for m in model.modules())
    assert model.config._attn_implementation == "grpo_native"             # cpu.attention_kernel's calls
    assert cpu.micro_batch_tokens(model) == max(256, 2 ** 20 // (32 * 2))   # the CPU heuristic, with its floor
    # the CUDA runtime never calls the CPU tuning (its methods are checked without a GPU where possible)
    calls.clear()
    cuda = CudaRuntime(torch.device("cuda", 0), cfg)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (8 * 2 ** 30, 16 * 2 ** 30))
    assert cuda.micro_batch_tokens(model) == max(1024, activation_tokens(model, 8 * 2 ** 30 // 4 // (36 * 4)))
    assert calls == []
    explicit = CudaRuntime(torch.device("cuda", 0), build_config(overrides={"train.micro_batch_tokens": 4096}))
    assert explicit.micro_batch_tokens(model) == 4096


def test_cpu_runtime_sets_the_decode_kernel(monkeypatch):
    """`cpu.decode_kernel`, `cpu.grad_kernel`, `cpu.elementwise_kernel` and `cpu.attention_kernel` are the
    CPU runtime's to apply (process-wide), before the first rollout."""
    from grpo.cpu import native_gemm

    monkeypatch.setattr(native_gemm, "_modes", dict(native_gemm._modes))
    CpuRuntime(torch.device("cpu"), build_config(overrides={"cpu.decode_kernel": "onednn", "cpu.grad_kernel": "onednn",
                                                            "cpu.elementwise_kernel": "torch",
                                                            "cpu.attention_kernel": "torch"})).prepare_process()
    uses = ("decode", "grad", "elementwise", "attention")
    assert native_gemm._modes == {"decode": "onednn", "grad": "onednn", "elementwise": "torch", "attention": "torch"}
    assert not any(native_gemm.active(use) for use in uses)
    CpuRuntime(torch.device("cpu"), build_config()).prepare_process()
    built = native_gemm.library() is not None
    assert native_gemm._modes == dict.fromkeys(uses, "auto")
    assert all(native_gemm.active(use) == built for use in uses)
    with pytest.raises(ValueError, match=re.escape("cpu.decode_kernel must be auto | native | onednn")):
        build_config(overrides={"cpu.decode_kernel": "mkl"})
    with pytest.raises(ValueError, match=re.escape("cpu.grad_kernel must be auto | native | onednn")):
        build_config(overrides={"train.grad_kernel": "mkl"})                  # the old name: an alias
    with pytest.raises(ValueError, match=re.escape("cpu.elementwise_kernel must be auto | native | torch")):
        build_config(overrides={"cpu.elementwise_kernel": "onednn"})
    with pytest.raises(ValueError, match=re.escape("cpu.attention_kernel must be auto | native | torch")):
        build_config(overrides={"cpu.attention_kernel": "sdpa"})


def test_attention_kernel_choice():
    assert attn_implementation("auto", torch.device("cpu")) is None        # the library's default (sdpa)
    assert attn_implementation("eager", torch.device("cpu")) == "eager"
    with pytest.raises(ConfigError, match="model.attn_implementation"):
        attn_implementation("flash", torch.device("cpu"))
    model = build_model(build_tokenizer(), "micro")
    set_attn_implementation(model, "eager", torch.device("cpu"))
    assert model.config._attn_implementation == "eager"


def test_auto_attention_on_cuda_takes_flash_attention_only_with_half_weights(monkeypatch):
    """flash-attention has no float32 kernel: `auto` keeps sdpa for float32 weights even with the package
    installed, and an explicit flash_attention_2 with float32 weights is a ConfigError naming the key."""
    import transformers.utils

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    assert attn_implementation("auto", cuda, torch.float32) == "sdpa"
    assert attn_implementation("auto", cuda, torch.bfloat16) == "flash_attention_2"
    assert attn_implementation("auto", cuda, torch.float16) == "flash_attention_2"
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: False)
    assert attn_implementation("auto", cuda, torch.bfloat16) == "sdpa"
    with pytest.raises(ConfigError, match="model.attn_implementation=flash_attention_2 needs bfloat16 or float16"):
        attn_implementation("flash_attention_2", cuda, torch.float32)
    assert attn_implementation("flash_attention_2", cuda, torch.bfloat16) == "flash_attention_2"
    with pytest.raises(ConfigError, match=re.escape("flash_attention_2 needs model.dtype bfloat16 | float16")):
        build_config(overrides={"model.attn_implementation": "flash_attention_2"})
    build_config(overrides={"model.attn_implementation": "flash_attention_2", "model.dtype": "bfloat16"})


# --- the memory budget (train.memory_budget_gib) ----------------------------------------------------

def test_meminfo_and_cgroup_parsing():
    from grpo.training.runtime import cgroup_room, meminfo_available

    text = "MemTotal:       24683632 kB\nMemFree:        23468224 kB\nMemAvailable:   24238080 kB\n"
    assert meminfo_available(text) == 24238080 * 1024
    assert meminfo_available("MemTotal: 1 kB\n") is None
    assert cgroup_room("4294967296\n", "1073741824\n") == 3 * 2 ** 30        # v2 memory.max - memory.current
    assert cgroup_room("max\n", "1073741824\n") is None                       # v2: no limit
    assert cgroup_room("9223372036854771712\n", "5\n") is None                # v1: "unlimited"
    assert cgroup_room("100\n", "150\n") == 0                                 # over the limit: no room


def test_default_budget_is_in_use_plus_a_safe_share_of_what_is_available(monkeypatch):
    import grpo.training.cpu_runtime as runtime_module   # the host-memory readings

    monkeypatch.setattr(runtime_module, "available_host_memory", lambda: 10 * 2 ** 30)
    monkeypatch.setattr(CpuRuntime, "memory_in_use", lambda self: 2 ** 30)
    auto = CpuRuntime(torch.device("cpu"), build_config())
    assert auto.memory_budget() == 2 ** 30 + int(0.8 * 10 * 2 ** 30)
    given = CpuRuntime(torch.device("cpu"), build_config(overrides={"train.memory_budget_gib": 3.5}))
    assert given.memory_budget() == int(3.5 * 2 ** 30)
    with pytest.raises(ConfigError, match="train.memory_budget_gib must be a finite number >= 0"):
        build_config(overrides={"train.memory_budget_gib": -1.0})


def test_this_process_memory_is_read():
    from grpo.training.runtime import available_host_memory, resident_bytes

    x = torch.ones(64, 2 ** 20, dtype=torch.uint8)             # 64 MiB, touched
    assert resident_bytes() > x.numel()
    assert available_host_memory() > 0


def test_ref_offload_auto_is_disk_on_cpu_for_a_large_full_copy_only(monkeypatch):
    import grpo.training.runtime_plan as runtime_module
    from grpo.config import LoraConfig
    from grpo.modeling.lora import apply_lora
    from tests.conftest import tiny_qwen2

    model = tiny_qwen2()                                                    # 83,072 bytes of float32 parameters
    cpu = lambda **over: CpuRuntime(torch.device("cpu"), build_config(overrides=over))   # noqa: E731
    cuda = lambda **over: CudaRuntime(torch.device("cuda", 0), build_config(overrides=over))   # noqa: E731
    assert cpu(**{"algorithm.beta": 0.04}).ref_offload(model) == "none"     # under 64 MiB: nothing to gain
    monkeypatch.setattr(runtime_module, "REF_OFFLOAD_MIN_BYTES", 83_072)
    assert cpu(**{"algorithm.beta": 0.04}).ref_offload(model) == "disk"
    assert cuda(**{"algorithm.beta": 0.04}).ref_offload(model) == "none"    # a GPU run keeps it on the device
    assert cpu(**{"algorithm.beta": 0.0}).ref_offload(model) == "none"      # no reference at all
    assert cpu(**{"algorithm.beta": 0.04, "algorithm.ref_update_steps": 2}).ref_offload(model) == "none"
    lora = apply_lora(tiny_qwen2(), LoraConfig(enabled=True, r=2, target_modules=["q_proj"]))
    assert cpu(**{"algorithm.beta": 0.04}).ref_offload(lora) == "none"      # the base model is the reference
    monkeypatch.setattr(runtime_module, "REF_OFFLOAD_MIN_BYTES", 83_073)
    assert cpu(**{"algorithm.beta": 0.04}).ref_offload(model) == "none"
    for mode in ("none", "disk", "cpu"):                                    # an explicit choice is kept
        assert cpu(**{"train.ref_offload": mode}).ref_offload(model) == mode
        assert cuda(**{"train.ref_offload": mode}).ref_offload(model) == mode


def test_ref_offload_config_errors():
    with pytest.raises(ConfigError, match="train.ref_offload must be auto | none | disk | cpu, got 'ssd'"):
        build_config(overrides={"train.ref_offload": "ssd"})
    with pytest.raises(ConfigError, match="train.ref_offload=disk needs algorithm.ref_update_steps = 0"):
        build_config(overrides={"train.ref_offload": "disk", "algorithm.ref_update_steps": 4})
    build_config(overrides={"train.ref_offload": "auto", "algorithm.ref_update_steps": 4})   # auto keeps it in memory


@pytest.mark.parametrize("setting, world, expected", [(True, 1, True), (False, 1, False), (True, 2, False)])
def test_cpu_runtime_plans_the_flat_gradient_buffer_for_one_process_only(monkeypatch, setting, world, expected):
    """cpu.grad_buffer reaches the update through the memory plan: on in one process, off under torchrun (DDP /
    FSDP2 manage the gradients) and when set off; the CUDA runtime never plans it."""
    from tests.conftest import tiny_qwen2

    monkeypatch.setenv("WORLD_SIZE", str(world))
    cfg = build_config(overrides={"cpu.grad_buffer": setting})
    assert CpuRuntime(torch.device("cpu"), cfg).memory_plan(tiny_qwen2(), 6).grad_buffer is expected
    assert build_config().cpu.grad_buffer is True                  # on by default
