"""The engines behind grpo/rollout/engine.py's seam; importing this package registers them."""

from grpo.rollout.engines import hf_generate, native, vllm_colocate, vllm_server  # noqa: F401
