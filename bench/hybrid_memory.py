"""Memory cost of Hybrid GRPO's critic against plain GRPO.

    .venv/bin/python bench/hybrid_memory.py [--model qwen2-57m] [--steps 2]

Each configuration runs `grpo train` in a fresh process (full fine-tuning, beta = 0, the settings of
bench/memory.py: G = 8, 2 prompts per step, 64-token completions) and reports its peak RSS. Hybrid GRPO
(`--algorithm.preset hybrid_grpo`, grpo/training/critic.py) adds a linear value head on the policy's
detached last hidden state (hidden_size + 1 parameters, their AdamW state) and one no-grad forward over
the step's B prompts. Writes bench/results/hybrid_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import build_bench_model, count_params, print_table, write_results  # noqa: E402
from bench.memory import run_one  # noqa: E402

CONFIGS = [
    ("grpo", {"lora.enabled": "false", "algorithm.beta": "0.0"}),
    ("hybrid_grpo", {"lora.enabled": "false", "algorithm.preset": "hybrid_grpo", "algorithm.beta": "0.0"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2-57m")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--models-dir", default=os.path.join(tempfile.gettempdir(), "grpo-bench-models"))
    args = parser.parse_args()
    model_dir = build_bench_model(args.model, args.models_dir)
    params = count_params(model_dir)
    hidden = json.loads((Path(model_dir) / "config.json").read_text())["hidden_size"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, options) in enumerate(CONFIGS):
            rows.append({"config": name, **run_one(model_dir, options, args.steps, Path(tmp) / str(i))})
    base = rows[0]["peak_rss_mb"]
    for r in rows:
        r["vs_grpo"] = r["peak_rss_mb"] / base
        r["delta_mb"] = r["peak_rss_mb"] - base
    head_params = hidden + 1
    print(f"model {args.model}: {params / 1e6:.1f}M parameters, {args.steps} steps, full fine-tuning, beta = 0, "
          f"G=8, 2 prompts/step, 64-token completions; value head {head_params} parameters "
          f"({head_params * 4 * 3 / 1024:.1f} KiB with AdamW's two moments)")
    print_table(rows, ["config", "peak_rss_mb", "delta_mb", "vs_grpo", "wall_s"])
    path = write_results("hybrid_memory", rows, {"model": args.model, "parameters": params, "steps": args.steps,
                                                 "value_head_parameters": head_params})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
