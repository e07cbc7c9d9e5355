"""Models and their forward passes: loading and building policies and tokenizers, per-token
log-probs and entropy (chunked LM head), the prompt-shared forward, the lean KV-cache decoder,
LoRA, the reference policy and mixed precision. Plain torch: a runtime's accelerations come in through
grpo.modeling.hooks (the CPU's live in grpo.cpu)."""
