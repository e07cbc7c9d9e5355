"""The `cpu` section: the CPU runtime's settings (grpo.training.cpu_runtime), read by nothing else.

These keys were `train.*`, `model.cpu_matmul` and `rollout.decode_kernel` before; the old names still work, as
aliases (:data:`OLD_KEYS`, in grpo.config.aliases.RENAMED): build_config maps them onto the new keys with one line on
stderr, and a resumed run's saved config is read through grpo.config.aliases.rewrite_tree, so the move is not a
config change.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config.aliases import RENAMED
from grpo.config.fields import _f


@dataclass(frozen=True)
class CpuConfig:
    num_threads: int = _f(0, "CPU threads for torch (0 = torch's default); 1 is often fastest for tiny models.")
    cpu_matmul: str = _f("auto", "float32 linear layers on CPU (grpo/cpu/kernels.py): onednn (oneDNN GEMMs, 2-3x "
                         "faster than MKL on AMD CPUs) | aten (PyTorch's default) | auto (onednn for models of hidden size "
                         ">= 512 when a short calibration on this machine finds it >= 1.25x faster). No effect on GPU or other dtypes.")
    decode_kernel: str = _f("auto", "The CPU rollout's float32 decode products at <= 64 rows: auto (native where it "
                            "builds, else onednn) | native (grpo's own AVX-512 kernel, compiled on first use with the "
                            "machine's C compiler into ~/.cache/grpo/kernels; an error where it cannot run) | onednn. "
                            "native overlaps the weights' reads with the multiply-adds (docs/performance.md).")
    grad_in_place: bool = _f(True, "CPU, one process: each linear layer's weight gradient is accumulated into .grad by "
                             "one in-place GEMM per micro-batch instead of a new tensor plus an add (same values; "
                             "grpo/cpu/grad_in_place.py GradIntoLinear). Off under torchrun (DDP / FSDP reduce "
                             "gradients from hooks this skips) and on CUDA. oneDNN-switched linears (cpu.cpu_matmul) add "
                             "their weight gradients into .grad in row blocks (float32; the lean SwiGLU MLP, "
                             "train.lean_layers, adds each whole product), or their bf16 weight "
                             "gradients into the float32 .grad (train.precision bf16).")
    grad_kernel: str = _f("auto", "CPU runtime: how oneDNN-switched float32 linears (cpu.cpu_matmul) and the fused LM "
                          "head add their weight gradients into .grad (cpu.grad_in_place): auto (native where it "
                          "builds, else onednn) | native (grpo's own AVX-512 kernel, the one of cpu.decode_kernel: "
                          "dW += dY^T X read in place, no transposed copies or product temporaries; an error where it "
                          "cannot run) | onednn (products in blocks, then added).")
    elementwise_kernel: str = _f("auto", "CPU runtime: the update's float32 elementwise passes of the lean SwiGLU MLP "
                                 "(train.lean_layers) and the fused LM head (log-softmax, entropy, dL/dlogits): auto "
                                 "(native where it builds, else torch) | native (grpo's own AVX-512 kernels, built with "
                                 "cpu.decode_kernel's: one pass over memory each, no temporaries; an error where "
                                 "they cannot run) | torch (torch's operators).")
    attention_kernel: str = _f("auto", "CPU runtime: float32 causal self-attention of up to 768 positions (the update's "
                               "passes, old and reference log-probs): auto (native where it builds, else torch) | "
                               "native (grpo's own AVX-512 kernel, forward and backward; an error where it cannot "
                               "run) | torch (transformers' sdpa). Longer sequences, dropout, sliding windows and other "
                               "attention implementations always keep sdpa.")
    mmap_threshold_mb: float = _f(0.0, "glibc: host allocations >= this many MiB come from mmap, fresh pages from the "
                                  "kernel each time, and go back to the OS when freed. 0 (default) = glibc's own "
                                  "dynamic threshold: on the shape grid it ran steps 2-3 5-20 % faster than 1 at about the "
                                  "same peak RSS (-76 to +55 MiB; +281 MiB at 1024 new tokens), the same from step 4 "
                                  "on at 100M (docs/performance.md). 1 or 0.25 (256 KiB) fix the threshold, for a "
                                  "heap that fragments.")
    malloc_trim: bool = _f(True, "CPU runtime, glibc: give the heap's free pages back to the OS once per step, after the "
                           "rollout and reference pass and before the update (malloc_trim), so the tensors the rollout "
                           "freed (packed weights, KV cache) do not stay resident as holes under the update's peak. "
                           "Measured on an AMD EPYC Zen 5 (bench/grid.py shapes, 4 steps, 3 rounds): peak RSS 25-75 MiB "
                           "lower than without it on 75.7M-100.7M models; steps the same at 100.7M, 6-11 % slower at 75.7M (the "
                           "trimmed pages are faulted in again). A second trim after the update lowered the peak no "
                           "further and cost 1-8 % (docs/performance.md). Ignored on CUDA.")
    huge_pages: bool = _f(True, "CPU runtime, Linux: the update's flat gradient buffer (cpu.grad_buffer) is advised as "
                          "2 MiB transparent huge pages before its zero fill (where the kernel's THP mode is madvise "
                          "or always). Where the kernel has free 2 MiB pages: ~200 page faults instead of ~100 k at 100M "
                          "parameters, 14-19 ms against 70-88 ms per update on an AMD EPYC VM, whose first such buffer "
                          "took 0.47 s once; where it has none, 4 KiB pages as before. Same values and resident size.")
    grad_buffer: bool = _f(True, "CPU runtime, one process: the update's gradients start as zeroed views of one flat "
                           "buffer instead of tensors made one by one in the first backward pass (same values). Those "
                           "land in the holes the first micro-batch's activations leave, and the heap grows by part of "
                           "a micro-batch with every later micro-batch; the buffer lives outside the heap and returns "
                           "to the OS after the step. AMD EPYC Zen 5, 6 steps, 3 alternated rounds: peak RSS 1921-1951 MiB "
                           "against 1972-1994 at 75.7M, 2352-2370 against 2378-2413 at 100.7M, the same step times "
                           "(docs/performance.md). Off under torchrun (DDP / FSDP2 own the gradients).")


#: old key -> its key in the `cpu` section (registered with grpo.config.aliases below).
OLD_KEYS: dict[str, str] = {
    "train.num_threads": "cpu.num_threads",
    "model.cpu_matmul": "cpu.cpu_matmul",
    "rollout.decode_kernel": "cpu.decode_kernel",
    "train.grad_in_place": "cpu.grad_in_place",
    "train.grad_kernel": "cpu.grad_kernel",
    "train.elementwise_kernel": "cpu.elementwise_kernel",
    "train.attention_kernel": "cpu.attention_kernel",
    "train.mmap_threshold_mb": "cpu.mmap_threshold_mb",
    "train.malloc_trim": "cpu.malloc_trim",
    "train.huge_pages": "cpu.huge_pages",
    "train.grad_buffer": "cpu.grad_buffer",
}

RENAMED.update(OLD_KEYS)
