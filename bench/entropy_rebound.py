"""Policy entropy over training on the embedded demo task, plain GRPO against entropy-shaped advantages.

    .venv/bin/python bench/entropy_rebound.py [--steps 100] [--jobs 2] [--configs grpo edge ...] [--out NAME]
    .venv/bin/python bench/entropy_rebound.py --steps 200 --preset-sweep 1e-4 --out preset_sweep   # every preset at lr
    .venv/bin/python bench/entropy_rebound.py --steps 100 --preset-sweep 3e-5 --set algorithm.num_iterations=2 --out ...

EDGE-GRPO (arXiv 2507.21848) and GTPO / GRPO-S (arXiv 2508.04349) report that the policy entropy recovers
after its early dip with entropy-shaped advantages, where GRPO's keeps falling. Each configuration below
is the demo's settings (grpo/cli/demo.py: G = 8, 16 prompts per step, seed 0, one torch thread) with the
named changes, trained in its own process through the Python API. The train set is the embedded task's
with a `solution` column (the worked completion, `<think>a+b=c,...</think><answer>n</answer>`), which
only guided error correction reads. Prints mean `policy/entropy` and training accuracy per block of 10
steps (20 past 100 steps) and writes bench/results/entropy_rebound.json, or NAME.json (the per-step curves too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_results  # noqa: E402

CONFIGS: dict[str, dict] = {
    "grpo": {},
    "edge": {"algorithm.entropy_advantage": "edge"},
    "grpo-beta0": {"algorithm.beta": 0.0},
    "edge_grpo-preset": {"algorithm.preset": "edge_grpo"},         # beta 0, guided error correction
    "grpo-beta0-lr1e-4": {"algorithm.beta": 0.0, "optim.lr": 1e-4},
    "edge_grpo-preset-lr1e-4": {"algorithm.preset": "edge_grpo", "optim.lr": 1e-4},
    # 2026-11-26: the entropy terms at 5x GTPO's weight, and both methods at 10x the demo's learning rate
    "gtpo-0.5-lr1e-4": {"algorithm.entropy_advantage": "gtpo", "algorithm.entropy_reward_weight": 0.5,
                        "algorithm.beta": 0.0, "optim.lr": 1e-4},
    "grpo_s-0.5-lr1e-4": {"algorithm.entropy_advantage": "grpo_s", "algorithm.entropy_reward_weight": 0.5,
                          "algorithm.beta": 0.0, "optim.lr": 1e-4},
    "grpo-beta0-lr3e-4": {"algorithm.beta": 0.0, "optim.lr": 3e-4},
    "edge_grpo-preset-lr3e-4": {"algorithm.preset": "edge_grpo", "optim.lr": 3e-4},
    # 2026-11-27, 300 steps (--out entropy_rebound_300): GTPO and GRPO-S at the paper's weight 0.1, and the presets
    "gtpo-lr1e-4": {"algorithm.entropy_advantage": "gtpo", "algorithm.beta": 0.0, "optim.lr": 1e-4},
    "grpo_s-lr1e-4": {"algorithm.entropy_advantage": "grpo_s", "algorithm.beta": 0.0, "optim.lr": 1e-4},
    "gtpo-preset": {"algorithm.preset": "gtpo"},
    "grpo_s-preset": {"algorithm.preset": "grpo_s"},
}

CHILD = """
import json, sys, torch
import grpo
from grpo.cli.demo import demo_settings
from grpo.config import build_config
from grpo.data.tasks.arithmetic import DEFAULT_REWARDS, generate, with_solutions
from grpo.modeling.models import EMBEDDED_MODEL_DIR, load_policy

out, steps, extra = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
torch.manual_seed(0)
model, tok = load_policy(str(EMBEDDED_MODEL_DIR))
rows = with_solutions(generate("train", 20000, seed=0))
flat = {"train.output_dir": out, "train.max_steps": steps, "train.save_final": False, "log.progress_bar": False,
        "train.seed": 0, "health.enabled": False, **extra}
grpo.Trainer(model, reward_funcs=list(DEFAULT_REWARDS), config=build_config(demo_settings(extra), flat), train_dataset=rows,
             tokenizer=tok).train()
"""


def run_config(name: str, steps: int, tmp: Path) -> dict:
    out = tmp / name
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), str(steps), json.dumps(CONFIGS[name])],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"bench/entropy_rebound.py: configuration {name} failed:\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"config": name, "overrides": CONFIGS[name],
            "entropy": [r["policy/entropy"] for r in records],
            "accuracy": [r["reward/accuracy/mean"] for r in records],
            "clip_frac": [r.get("policy/clip_frac", 0.0) for r in records],
            "gec_injected": [r.get("advantages/gec_injected", 0) for r in records]}


def blocks(values: list[float], size: int = 10) -> list[float]:
    return [sum(values[i:i + size]) / len(values[i:i + size]) for i in range(0, len(values), size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2, help="configurations run at once (one thread each)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--out", default="entropy_rebound", help="results file name under bench/results (no .json)")
    parser.add_argument("--preset-sweep", type=float, metavar="LR",
                        help="instead of --configs: every algorithm preset at this learning rate (a stress test)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides added to every configuration (values parsed as JSON, else strings)")
    args = parser.parse_args()
    if args.preset_sweep:
        from grpo.config.presets import PRESETS

        for name in PRESETS:
            CONFIGS[f"{name}-lr{args.preset_sweep:g}"] = {"algorithm.preset": name, "optim.lr": args.preset_sweep}
        args.configs = [f"{name}-lr{args.preset_sweep:g}" for name in PRESETS]
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
        for name in args.configs:
            CONFIGS[name] = {**CONFIGS[name], key: value}
    size = 10 if args.steps <= 100 else 20
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda n: run_config(n, args.steps, Path(tmp)), args.configs))
    head = "| configuration | measure | " + " | ".join(f"{i + 1}-{min(i + size, args.steps)}"
                                                         for i in range(0, args.steps, size)) + " |"
    lines = [head, "|" + " --- |" * (2 + len(range(0, args.steps, size)))]
    for row in rows:
        for key in ("entropy", "accuracy"):
            lines.append(f"| {row['config']} | {key} | " + " | ".join(f"{v:.3f}" for v in blocks(row[key], size)) + " |")
    table = "\n".join(lines)
    print(table)
    print(f"wrote {write_results(args.out, rows, {'steps': args.steps, 'markdown': table})}")


if __name__ == "__main__":
    main()
