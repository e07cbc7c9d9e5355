"""Rollouts with oneDNN-prepacked weights against the same rollout without (grpo/modeling/rollout_weights.py).

    .venv/bin/python bench/decode_pack.py [--shapes h64-l2,h256-l6,h512-l8,h768-l12] [--rounds 4]

On CPU float32 the lean decoder reorders every projection (q/k/v and gate/up fused) and the LM head once per
rollout into oneDNN's blocked layout; without it, oneDNN re-lays each weight out at every decode product. This
times `grpo.rollout.sample` both ways, alternating within one process per shape (the packing switched off by
making `can_prepack` say no), on the grid's Qwen2 shapes (bench/grid.py: 32k vocabulary, G = 8, 2 prompts of 24
tokens, 64 new tokens, EOS off so every row runs to the end, 2 threads). Both ways draw the same tokens (checked).
`pack_mib` is the size of the packed copies, which live for one rollout. Writes bench/results/decode_pack.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {"h64-l2": (64, 2), "h256-l6": (256, 6), "h512-l8": (512, 8), "h768-l12": (768, 12)}
G, PROMPTS, PROMPT_LEN, NEW = 8, 2, 24, 64


def measure(name: str, rounds: int) -> dict:
    import torch

    from grpo.cpu.hooks import CpuRolloutWeights
    from bench.common import count_params
    from bench.grid import build_model
    from grpo.cpu.placement import use_cpu_matmul
    from grpo.training.cpu_runtime import install_hooks
    from grpo.modeling.models import load_policy
    from grpo.rollout import sample
    from grpo.rollout.params import Prompts, SamplingParams

    hidden, layers = SHAPES[name]
    model_dir = build_model(hidden, layers, 32768)
    model, tok = load_policy(str(model_dir))
    install_hooks()                                   # the CPU runtime's rollout hook
    use_cpu_matmul(model, "auto")
    ids = torch.randint(100, 30000, (PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    packing = CpuRolloutWeights.pack_rows

    def run(pack: bool) -> tuple[float, torch.Tensor]:
        CpuRolloutWeights.pack_rows = packing if pack else (lambda *a: None)
        t0 = time.perf_counter()
        out = sample(model, Prompts(ids, mask),
                     SamplingParams(n=G, max_tokens=NEW, temperature=1.0, stop_token_ids=(-1,), seed=0),
                     pad_token_id=tok.pad_token_id)
        return time.perf_counter() - t0, out.completion_ids

    try:
        run(True), run(False)                                                  # warm-up
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for pack in (False, True):
                seconds, tokens = run(pack)
                times[pack].append(seconds)
                if pack:
                    assert torch.equal(tokens, plain_tokens), f"{name}: packed rollout drew other tokens"
                else:
                    plain_tokens = tokens
    finally:
        CpuRolloutWeights.pack_rows = packing
    inner = model.model
    pack_values = sum(m.weight.numel() for layer in inner.layers for m in
                      (*(getattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
                       *(getattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))))
    pack_values += model.lm_head.weight.numel()
    plain, packed = statistics.median(times[False]), statistics.median(times[True])
    return {"shape": name, "params": count_params(model_dir), "plain_s": plain, "packed_s": packed,
            "speedup": plain / packed, "tokens_per_s_packed": G * PROMPTS * NEW / packed,
            "pack_mib": pack_values * 4 / 2 ** 20, "plain_runs": times[False], "packed_runs": times[True]}


def main() -> None:
    import torch

    from bench.common import print_table, write_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [measure(name, args.rounds) for name in args.shapes.split(",")]
    print_table(rows, ["shape", "params", "plain_s", "packed_s", "speedup", "tokens_per_s_packed", "pack_mib"])
    write_results("decode_pack", rows, {"rounds": args.rounds, "G": G, "prompts": PROMPTS, "new_tokens": NEW,
                                        "threads": 2})


if __name__ == "__main__":
    main()
