"""Models and their forward passes: loading and building policies and tokenizers, per-token
log-probs and entropy (chunked LM head), the prompt-shared forward, the lean KV-cache decoder,
LoRA, the reference policy, mixed precision and the CPU GEMM kernels."""
