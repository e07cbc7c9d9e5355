"""CPU-only machinery of the CPU runtime (grpo.training.cpu_runtime, the only importer): oneDNN linears and their
placement, grpo's native AVX-512 kernels as torch operators (``torch.ops.grpo``), in-place gradients, kept host
buffers, glibc heap settings and the VML warm-up. Model code (grpo.modeling) reaches them only through the hooks of
grpo.modeling.hooks, which the CPU runtime installs (grpo.cpu.hooks)."""
