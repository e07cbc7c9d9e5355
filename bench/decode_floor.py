"""What bounds a decode step: its weight products alone, by dtype and kernel, against memory bandwidth; where a
rollout's time goes; and the rollout in float32 against bf16 (`rollout.precision`).

    .venv/bin/python bench/decode_floor.py [--shapes h768-l12,h512-l8] [--repeats 20] [--rounds 3]

Per shape (bench/grid.py's Qwen2 shapes, 32k vocabulary; 16 rows = G 8 x 2 prompts; 2 threads unless
OMP_NUM_THREADS says otherwise):

* products: the 4 products of every layer (q/k/v fused, o, gate/up fused, down) and the LM head, on
  [16, K] inputs, as one decode step runs them: float32 through MKL (`F.linear`), float32 and bfloat16
  oneDNN-packed (grpo.modeling.cpu_kernels.prepack, what the rollout uses), bfloat16 unpacked; ms per step
  and GB/s of weights read; beside a plain read of a 400 MB tensor (`sum`);
* a float32 rollout (`grpo.rollout.sample`, 64 new tokens, EOS off) split into the products
  (grpo.modeling.decoder.linear), the rest of the decode steps, and what is outside them (prefill, token choice);
* the rollout in float32 and under bf16 autocast (`rollout.precision: bf16`), alternating `--rounds` times.

Writes bench/results/decode_floor.json.
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


def products(hidden: int, inter: int, layers: int, kv_dim: int, repeats: int) -> list[dict]:
    """ms per decode step of the weight products alone, by dtype and kernel."""
    import torch
    import torch.nn.functional as F

    from grpo.modeling.cpu_kernels import _dnn, bf16_native, prepack

    shapes = [(hidden + 2 * kv_dim, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)] * layers
    shapes.append((VOCAB, hidden))
    kinds = [("float32", "MKL (F.linear)", torch.float32, False), ("float32", "oneDNN packed", torch.float32, True)]
    if bf16_native():
        kinds += [("bfloat16", "oneDNN packed", torch.bfloat16, True), ("bfloat16", "unpacked (F.linear)",
                                                                        torch.bfloat16, False)]
    out = []
    for dtype_name, kernel, dtype, pack in kinds:
        g = torch.Generator().manual_seed(0)
        ws = [torch.randn(n, k, generator=g).to(dtype) for n, k in shapes]
        if pack:
            ws = [prepack(w, ROWS) for w in ws]
        xs = {k: torch.randn(ROWS, k, generator=g).to(dtype) for k in (hidden, inter)}
        mul = (lambda x, w: _dnn(x, w)) if pack else (lambda x, w: F.linear(x, w))
        for _ in range(3):
            for w, (_, k) in zip(ws, shapes):
                mul(xs[k], w)
        t0 = time.perf_counter()
        for _ in range(repeats):
            for w, (_, k) in zip(ws, shapes):
                mul(xs[k], w)
        step = (time.perf_counter() - t0) / repeats
        nbytes = sum(n * k for n, k in shapes) * (2 if dtype == torch.bfloat16 else 4)
        out.append({"dtype": dtype_name, "kernel": kernel, "ms_per_step": step * 1e3, "gb_s": nbytes / step / 1e9})
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

    import grpo.modeling.decoder as decoder
    from bench.common import arithmetic_rows
    from bench.grid import build_model
    from grpo.data.prompts import tokenize_prompts
    from grpo.modeling.cpu_kernels import bf16_native, use_cpu_matmul
    from grpo.modeling.models import load_policy
    from grpo.rollout import sample

    model, tok = load_policy(str(build_model(hidden, layers, VOCAB)))
    use_cpu_matmul(model, "auto")
    batch = tokenize_prompts(tok, arithmetic_rows(2, tok))
    spent = {"linear": 0.0, "step": 0.0}
    real_linear, real_step = decoder.linear, decoder.LeanDecoder.step

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
            sample(model, batch.prompt_ids, batch.prompt_mask, num_generations=ROWS // 2, max_new_tokens=NEW,
                   temperature=1.0, eos_token_id=-1, pad_token_id=tok.pad_token_id, seed=seed)
        return time.perf_counter() - t

    go(0, False)
    split = []
    decoder.linear, decoder.LeanDecoder.step = timed_linear, timed_step
    try:
        for r in range(rounds):
            spent.update(linear=0.0, step=0.0)
            total = go(r + 1, False)
            split.append({"total_s": total, "products_s": spent["linear"], "other_decode_s": spent["step"] - spent["linear"],
                          "outside_decode_s": total - spent["step"]})
    finally:
        decoder.linear, decoder.LeanDecoder.step = real_linear, real_step
    pairs = []
    if bf16_native():
        go(0, True)
        for r in range(rounds):
            pairs.append({"fp32_s": go(r + 1, False), "bf16_s": go(r + 1, True)})
    return {"split": split, "pairs": pairs}


def main() -> None:
    from bench.common import write_results
    from bench.grid import shape_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="h768-l12", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    bandwidth = read_bandwidth()
    print(f"plain read: {bandwidth:.1f} GB/s")
    for name in args.shapes.split(","):
        hidden, layers = SHAPES[name]
        c = shape_config(hidden, layers)
        kv_dim = c["num_key_value_heads"] * hidden // c["num_attention_heads"]
        prods = products(hidden, c["intermediate_size"], layers, kv_dim, args.repeats)
        roll = rollouts(hidden, layers, args.rounds)
        row = {"shape": name, "products": prods, **roll, "read_gb_s": bandwidth}
        print(f"\n{name}: products of one decode step ({ROWS} rows)")
        print("| weights | kernel | ms per step | GB/s |\n| --- | --- | --- | --- |")
        for p in prods:
            print(f"| {p['dtype']} | {p['kernel']} | {p['ms_per_step']:.1f} | {p['gb_s']:.1f} |")
        med = {k: statistics.median(s[k] for s in roll["split"]) for k in roll["split"][0]}
        print(f"float32 rollout: {med['total_s']:.2f} s = products {med['products_s']:.2f} + other decode "
              f"{med['other_decode_s']:.2f} + outside {med['outside_decode_s']:.2f}")
        if roll["pairs"]:
            speed = statistics.median(p["fp32_s"] / p["bf16_s"] for p in roll["pairs"])
            row["bf16_speedup"] = speed
            print(f"rollout fp32 {statistics.median(p['fp32_s'] for p in roll['pairs']):.2f} s, bf16 "
                  f"{statistics.median(p['bf16_s'] for p in roll['pairs']):.2f} s: {speed:.2f}x")
        rows.append(row)
    print(f"wrote {write_results('decode_floor', rows, {'rows_per_step': ROWS, 'new_tokens': NEW})}")


if __name__ == "__main__":
    main()
