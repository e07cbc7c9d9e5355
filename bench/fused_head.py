"""The one-buffer LM head (grpo/modeling/fused_head.py) against the checkpointed per-chunk head, by model shape.

    .venv/bin/python bench/fused_head.py [--shapes h64-l2,base,vocab152k] [--rounds 5]

For each shape of bench/grid.py (a random Qwen2; 16 rows x (24 prompt + 64 completion) tokens, 2 threads, the
trainer's CPU setup: `cpu.cpu_matmul: auto`, in-place weight gradients, glibc's mmap threshold as `cpu.mmap_threshold_mb` sets it), one
process alternates the two heads `--rounds` times over two passes as the trainer runs them: the update's
forward+backward (log-probs and entropies through grpo.modeling.logprobs.completion_logprobs, rows in the
default token-budget micro-batches) and the reference pass (the same without autograd). Reports the median
seconds of each and their ratio (checkpointed / fused: > 1 means the fused head is faster) and the peak RSS
increase of each pass over the memory before it (sampled every 2 ms). Writes bench/results/fused_head.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS, PROMPT, NEW = 16, 24, 64


def measure(shape: str, rounds: int) -> dict:
    import torch

    from bench.common import PeakRSS, median
    from bench.grid import build_model, point_spec
    from grpo.config import build_config
    from grpo.modeling import fused_head
    from grpo.cpu.heap import set_mmap_threshold
    from grpo.cpu.placement import use_cpu_matmul
    from grpo.modeling.logprobs import bucketed_micro_batches, completion_logprobs
    from grpo.modeling.models import load_policy
    from grpo.training.cpu_runtime import install_hooks, micro_batch_tokens

    torch.set_num_threads(2)
    set_mmap_threshold(build_config().cpu.mmap_threshold_mb)      # as grpo train
    p = point_spec(shape)
    model, _ = load_policy(str(build_model(p["hidden"], p["layers"], p["vocab"])))
    install_hooks()                                           # the CPU runtime's model-code hooks
    use_cpu_matmul(model, "auto", grad_in_place=True)
    budget = micro_batch_tokens(0, model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, p["vocab"], (ROWS, PROMPT + NEW), generator=gen)
    mask = torch.ones_like(ids)
    real = fused_head.applies

    def update():
        model.train()
        for rows in bucketed_micro_batches(mask, 0, budget):
            logp, ent = completion_logprobs(model, ids[rows], mask[rows], NEW, with_entropy=True)
            (logp.sum() + 0.01 * ent.sum()).backward()
        model.zero_grad(set_to_none=True)

    def reference():
        model.eval()
        with torch.no_grad():
            for rows in bucketed_micro_batches(mask, 0, budget):
                completion_logprobs(model, ids[rows], mask[rows], NEW)

    rss = PeakRSS()
    times = {(h, f): [] for h in ("fused", "chunks") for f in ("update", "reference")}
    peaks = {k: [] for k in times}
    for r in range(rounds + 1):                                   # round 0 warms both up
        for head in (("fused", "chunks") if r % 2 else ("chunks", "fused")):
            fused_head.applies = real if head == "fused" else (lambda *a: False)
            for name, fn in (("update", update), ("reference", reference)):
                rss.reset()
                base = rss.current()
                t0 = time.perf_counter()
                fn()
                if r:
                    times[head, name].append(time.perf_counter() - t0)
                    peaks[head, name].append(rss.peak() - base)
    fused_head.applies = real
    rss.close()
    row = {"shape": shape, "params": sum(q.numel() for q in model.parameters()), "vocab": p["vocab"],
           "micro_batch_tokens": budget, "rounds": rounds}
    for (head, name), ts in times.items():
        row[f"{name}_{head}_s"] = median(ts)
        row[f"{name}_{head}_peak_mb"] = median(peaks[head, name])
    for name in ("update", "reference"):
        row[f"{name}_speedup"] = row[f"{name}_chunks_s"] / row[f"{name}_fused_s"]
    return row


def main() -> None:
    from bench.common import print_table, write_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="h64-l2,h256-l6,base,vocab152k")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        rows.append(measure(shape, args.rounds))
        print(rows[-1], flush=True)
    print_table(rows, ["shape", "params", "vocab", "micro_batch_tokens", "update_chunks_s", "update_fused_s",
                       "update_speedup", "update_chunks_peak_mb", "update_fused_peak_mb", "reference_chunks_s",
                       "reference_fused_s", "reference_speedup", "reference_chunks_peak_mb",
                       "reference_fused_peak_mb"])
    write_results("fused_head", rows, {"rounds": args.rounds, "rows_x_tokens": [ROWS, PROMPT + NEW]})


if __name__ == "__main__":
    main()
