"""The vLLM server engine (rollout.vllm.mode server): being written."""
