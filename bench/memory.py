"""Peak resident memory of GRPO training steps: LoRA vs full fine-tuning, with and without KL.

    .venv/bin/python bench/memory.py [--model qwen2-57m] [--steps 2]

Each configuration runs `grpo train` in a fresh process on a locally built Qwen2 (~57M parameters,
32k vocabulary) and reports that process's peak RSS. With LoRA the reference policy is the same
model with its adapters disabled, so `beta > 0` should cost almost nothing over `beta = 0`; full
fine-tuning with `beta > 0` holds a frozen copy of the model. Writes bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import build_bench_model, count_params, print_table, write_results  # noqa: E402

CHILD = """
import json, resource, sys
from grpo.cli.main import main
code = main(sys.argv[1:])
print("PEAK_RSS_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, flush=True)
sys.exit(code)
"""

CONFIGS = [
    ("lora, beta=0", {"lora.enabled": "true", "algorithm.beta": "0.0"}),
    ("lora, beta=0.04", {"lora.enabled": "true", "algorithm.beta": "0.04"}),
    ("full, beta=0", {"lora.enabled": "false", "algorithm.beta": "0.0"}),
    ("full, beta=0.04", {"lora.enabled": "false", "algorithm.beta": "0.04"}),
]


def run_one(model_dir: Path, options: dict[str, str], steps: int, out_dir: Path) -> dict:
    args = ["train", "--model", str(model_dir), "--max-steps", str(steps), "--output-dir", str(out_dir),
            "--train.prompts_per_step", "2", "--rollout.num_generations", "8", "--rollout.max_new_tokens", "64",
            "--train.micro_batch_size", "8", "--train.save_final", "false", "--log.progress_bar", "false",
            "--cpu.num_threads", "1", "--optim.lr", "1e-5"]
    for key, value in options.items():
        args += [f"--{key}", value]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench/memory.py: `grpo {' '.join(args)}` failed:\n{proc.stderr[-2000:]}")
    peak = next(float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("PEAK_RSS_MB"))
    return {"peak_rss_mb": peak, "wall_s": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2-57m")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--models-dir", default=os.path.join(tempfile.gettempdir(), "grpo-bench-models"))
    args = parser.parse_args()
    model_dir = build_bench_model(args.model, args.models_dir)
    params = count_params(model_dir)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, options) in enumerate(CONFIGS):
            r = run_one(model_dir, options, args.steps, Path(tmp) / str(i))
            rows.append({"config": name, **r})
    base = {r["config"]: r["peak_rss_mb"] for r in rows}
    for r in rows:
        r["vs_lora_beta0"] = r["peak_rss_mb"] / base["lora, beta=0"]
    print(f"model {args.model}: {params / 1e6:.1f}M parameters, {args.steps} GRPO steps, G=8, 2 prompts/step, "
          f"64-token completions")
    print_table(rows, ["config", "peak_rss_mb", "vs_lora_beta0", "wall_s"])
    ratio = base["lora, beta=0.04"] / base["lora, beta=0"]
    print(f"LoRA beta>0 / LoRA beta=0 = {ratio:.3f} (goal <= 1.15)")
    path = write_results("memory", rows, {"model": args.model, "parameters": params, "steps": args.steps,
                                          "lora_kl_ratio": ratio})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
