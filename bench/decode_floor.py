"""What bounds a decode step: its weight products alone, by dtype and kernel, against memory bandwidth and the GEMM
peak; where a rollout's time goes; the rollout with `cpu.decode_kernel` native against onednn; and float32 against
bf16 (`rollout.precision`).

    .venv/bin/python bench/decode_floor.py [--shapes h768-l12,h512-l8] [--rows 16] [--repeats 20] [--rounds 3]
                                           [--out decode_floor]

Per shape (bench/grid.py's Qwen2 shapes, 32k vocabulary; 16 rows = G 8 x 2 prompts; 2 threads unless
OMP_NUM_THREADS says otherwise):

* products: the 4 products of every layer (q/k/v fused, o, gate/up fused, down) and the LM head, on
  [rows, K] inputs, as one decode step runs them, for each of `--rows`: float32 through MKL (`F.linear`),
  float32 oneDNN-packed (grpo.cpu.kernels.prepack's oneDNN layout), float32 through grpo's native decode
  kernel (grpo.cpu.native_gemm, where it builds), bfloat16 oneDNN-packed and unpacked; ms per step, GB/s of
  weights read, and the time a kernel that reads and multiplies one after the other would take
  (bytes / plain read + flops / GEMM peak); beside a plain read of a 400 MB tensor (`sum`) and the fp32 GEMM peak
  (bench.common.matmul_peak_flops);
* a float32 rollout (`grpo.rollout.sample`, 64 new tokens, EOS off) split into the products
  (grpo.cpu.hooks.linear, the CPU runtime's rollout hook), the rest of the decode steps, and what is outside them (prefill, token choice);
* the float32 rollout with `cpu.decode_kernel` native and onednn, and in float32 and under bf16 autocast
  (`rollout.precision: bf16`), alternating `--rounds` times.

Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {"h256-l6": (256, 6), "h512-l8": (512, 8), "h768-l12": (768, 12), "h1024-l24": (1024, 24)}
ROWS, NEW, VOCAB = 16, 64, 32768


def products(hidden: int, inter: int, layers: int, kv_dim: int, rows: int, repeats: int) -> list[dict]:
    """ms per decode step of the weight products alone, by dtype and kernel."""
    import torch
    import torch.nn.functional as F

    from grpo.cpu import native_gemm
    from grpo.cpu.kernels import bf16_native, onednn_linear, padded_rows

    shapes = [(hidden + 2 * kv_dim, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)] * layers
    shapes.append((VOCAB, hidden))
    onednn = (lambda w: torch.ops.mkldnn._reorder_linear_weight(w, padded_rows(rows)), onednn_linear)
    plain = (lambda w: w, F.linear)
    kinds = [("float32", "MKL (F.linear)", torch.float32, plain), ("float32", "oneDNN packed", torch.float32, onednn)]
    if native_gemm.library() is not None:
        kinds.append(("float32", "native (cpu.decode_kernel)", torch.float32, (native_gemm.pack, native_gemm.matmul)))
    if bf16_native():
        kinds += [("bfloat16", "oneDNN packed", torch.bfloat16, onednn),
                  ("bfloat16", "unpacked (F.linear)", torch.bfloat16, plain)]
    out = []
    for dtype_name, kernel, dtype, (prepare, mul) in kinds:
        g = torch.Generator().manual_seed(0)
        ws = [prepare(torch.randn(n, k, generator=g).to(dtype)) for n, k in shapes]
        xs = {k: torch.randn(rows, k, generator=g).to(dtype) for k in (hidden, inter)}
        for _ in range(3):
            for w, (_, k) in zip(ws, shapes):
                mul(xs[k], w)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for w, (_, k) in zip(ws, shapes):
                mul(xs[k], w)
            times.append(time.perf_counter() - t0)
        step = statistics.median(times)
        nbytes = sum(n * k for n, k in shapes) * (2 if dtype == torch.bfloat16 else 4)
        out.append({"rows": rows, "dtype": dtype_name, "kernel": kernel, "ms_per_step": step * 1e3,
                    "gb_s": nbytes / step / 1e9, "bytes": nbytes, "flops": 2 * rows * sum(n * k for n, k in shapes)})
        del ws
    return out


def read_bandwidth() -> float:
    """GB/s of a plain read (`sum`) of a 400 MB float32 tensor."""
    import torch

    a = torch.ones(100_000_000)
    a.sum()
    t0 = time.perf_counter()
    for _ in range(5):
        a.sum()
    return a.numel() * 4 * 5 / (time.perf_counter() - t0) / 1e9


def rollouts(hidden: int, layers: int, rounds: int) -> dict:
    """The float32 rollout split into products / other decode work / outside the decode steps, and float32
    against bf16 autocast, alternating."""
    import torch

    import grpo.cpu.hooks as cpu_hooks
    import grpo.modeling.decoder as decoder
    from bench.common import arithmetic_rows
    from bench.grid import build_model
    from grpo.data.prompts import tokenize_prompts
    from grpo.cpu import native_gemm
    from grpo.cpu.kernels import bf16_native
    from grpo.cpu.placement import use_cpu_matmul
    from grpo.training.cpu_runtime import install_hooks
    from grpo.modeling.models import load_policy
    from grpo.rollout import sample
    from grpo.rollout.params import Prompts, SamplingParams

    model, tok = load_policy(str(build_model(hidden, layers, VOCAB)))
    install_hooks()                                   # the CPU runtime's rollout hook
    use_cpu_matmul(model, "auto")
    batch = tokenize_prompts(tok, arithmetic_rows(2, tok))
    spent = {"linear": 0.0, "step": 0.0}
    real_linear, real_step = cpu_hooks.linear, decoder.LeanDecoder.step

    def timed_linear(*a, **k):
        t = time.perf_counter()
        y = real_linear(*a, **k)
        spent["linear"] += time.perf_counter() - t
        return y

    def timed_step(self, *a):
        t = time.perf_counter()
        y = real_step(self, *a)
        spent["step"] += time.perf_counter() - t
        return y

    def go(seed: int, bf16: bool) -> float:
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            sample(model, Prompts(batch.prompt_ids, batch.prompt_mask),
                   SamplingParams(n=ROWS // 2, max_tokens=NEW, temperature=1.0, stop_token_ids=(-1,), seed=seed),
                   pad_token_id=tok.pad_token_id)
        return time.perf_counter() - t

    def with_kernel(mode: str, seed: int) -> float:
        native_gemm.configure(mode)
        try:
            return go(seed, False)
        finally:
            native_gemm.configure("auto")

    go(0, False)
    split = []
    cpu_hooks.linear, decoder.LeanDecoder.step = timed_linear, timed_step
    try:
        for r in range(rounds):
            spent.update(linear=0.0, step=0.0)
            total = go(r + 1, False)
            split.append({"total_s": total, "products_s": spent["linear"], "other_decode_s": spent["step"] - spent["linear"],
                          "outside_decode_s": total - spent["step"]})
    finally:
        cpu_hooks.linear, decoder.LeanDecoder.step = real_linear, real_step
    kernels = []
    if native_gemm.library() is not None:
        with_kernel("onednn", 0)
        for r in range(rounds):
            kernels.append({"native_s": with_kernel("native", r + 1), "onednn_s": with_kernel("onednn", r + 1)})
    pairs = []
    if bf16_native():
        go(0, True)
        for r in range(rounds):
            pairs.append({"fp32_s": go(r + 1, False), "bf16_s": go(r + 1, True)})
    return {"split": split, "kernels": kernels, "pairs": pairs}


def main() -> None:
    from bench.common import matmul_peak_flops, write_results
    from bench.grid import shape_config

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="h768-l12", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--rows", default=str(ROWS), help="comma-separated row counts of the products (default 16)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="decode_floor", help="results file name under bench/results/")
    args = parser.parse_args()
    rows = []
    bandwidth = read_bandwidth()
    peak = matmul_peak_flops(torch.get_num_threads())
    print(f"plain read: {bandwidth:.1f} GB/s; float32 GEMM peak: {peak / 1e9:.0f} GFLOP/s")
    for name in args.shapes.split(","):
        hidden, layers = SHAPES[name]
        c = shape_config(hidden, layers)
        kv_dim = c["num_key_value_heads"] * hidden // c["num_attention_heads"]
        prods = [p for n in args.rows.split(",")
                 for p in products(hidden, c["intermediate_size"], layers, kv_dim, int(n), args.repeats)]
        for p in prods:
            p["serial_ms"] = (p["bytes"] / (bandwidth * 1e9) + p["flops"] / peak) * 1e3
        roll = rollouts(hidden, layers, args.rounds)
        row = {"shape": name, "products": prods, **roll, "read_gb_s": bandwidth, "peak_gflops": peak / 1e9}
        print(f"\n{name}: products of one decode step")
        print("| rows | weights | kernel | ms per step | GB/s | read-then-multiply ms |\n| --- | --- | --- | --- | --- | --- |")
        for p in prods:
            print(f"| {p['rows']} | {p['dtype']} | {p['kernel']} | {p['ms_per_step']:.2f} | {p['gb_s']:.1f} | "
                  f"{p['serial_ms']:.2f} |")
        med = {k: statistics.median(s[k] for s in roll["split"]) for k in roll["split"][0]}
        print(f"float32 rollout: {med['total_s']:.2f} s = products {med['products_s']:.2f} + other decode "
              f"{med['other_decode_s']:.2f} + outside {med['outside_decode_s']:.2f}")
        if roll["kernels"]:
            speed = statistics.median(k["onednn_s"] / k["native_s"] for k in roll["kernels"])
            row["native_speedup"] = speed
            print(f"rollout decode_kernel native {statistics.median(k['native_s'] for k in roll['kernels']):.2f} s, "
                  f"onednn {statistics.median(k['onednn_s'] for k in roll['kernels']):.2f} s: {speed:.2f}x")
        if roll["pairs"]:
            speed = statistics.median(p["fp32_s"] / p["bf16_s"] for p in roll["pairs"])
            row["bf16_speedup"] = speed
            print(f"rollout fp32 {statistics.median(p['fp32_s'] for p in roll['pairs']):.2f} s, bf16 "
                  f"{statistics.median(p['bf16_s'] for p in roll['pairs']):.2f} s: {speed:.2f}x")
        rows.append(row)
    print(f"wrote {write_results(args.out, rows, {'new_tokens': NEW})}")


if __name__ == "__main__":
    main()
