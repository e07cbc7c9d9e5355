"""`rollout.vllm`: the vLLM engine's settings (grpo/rollout/engines/vllm_*.py), named after TRL's vllm_* keys."""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config.fields import _f

#: `rollout.engine` values (grpo/rollout/engine.py).
ENGINE_NAMES = ("auto", "native", "transformers", "vllm")


@dataclass(frozen=True)
class VllmConfig:
    mode: str = _f("colocate", "colocate (a vllm.LLM in each training process; TRL's vllm_mode colocate) | server "
                   "(generation in a `grpo vllm-serve` process, over HTTP; TRL's vllm_mode server).")
    gpu_memory_utilization: float = _f(0.3, "GPU share vLLM may take for weights and KV cache (colocate; TRL's "
                                       "vllm_gpu_memory_utilization, default 0.3). No effect on CPU: see kv_cache_gb.")
    kv_cache_gb: float = _f(1.0, "CPU only: GiB of KV cache vLLM's CPU backend reserves (its VLLM_CPU_KVCACHE_SPACE).")
    tensor_parallel_size: int = _f(1, "GPUs one colocated engine spans (TRL's vllm_tensor_parallel_size).")
    enable_sleep_mode: bool = _f(False, "Colocate on GPU: vLLM sleeps (frees its KV cache, offloads weights) during "
                                 "the update and wakes for the next rollout (TRL's vllm_enable_sleep_mode).")
    max_model_length: int = _f(0, "vLLM's max_model_len (TRL's vllm_max_model_length); 0 = the longest prompt plus "
                               "rollout.max_new_tokens, rounded up.")
    model_impl: str = _f("auto", "vLLM's model implementation: auto | vllm | transformers (TRL's vllm_model_impl).")
    dtype: str = _f("auto", "Weights' dtype inside vLLM: auto (the policy's model.dtype) | float32 | bfloat16 | float16.")
    enforce_eager: str = _f("auto", "auto (eager on CPU, CUDA graphs on GPU) | true | false: vLLM's enforce_eager.")
    server_base_url: str | None = _f(None, "Server mode: the URL of `grpo vllm-serve` (TRL's vllm_server_base_url); "
                                     "empty = http://server_host:server_port.")
    server_host: str = _f("127.0.0.1", "Server mode: host of the server when server_base_url is empty.")
    server_port: int = _f(8000, "Server mode: port of the server when server_base_url is empty.")
    server_timeout: float = _f(240.0, "Server mode: seconds to wait for the server at start and for one request "
                               "(TRL's vllm_server_timeout); requests are retried until then.")
