"""The embedded task on CUDA against the same run on the CPU: one script for a GPU owner.

    .venv/bin/python bench/gpu_check.py                 # CPU, then 1 GPU, then 2 GPUs under torchrun (when present)
    .venv/bin/python bench/gpu_check.py --runs cpu,cuda1 --steps 30 --out gpu_check
    .venv/bin/python bench/gpu_check.py --quick         # CPU only, 2 steps: checks the script, not a result

Each run is `grpo train` on the embedded default (the demo's model and task, `train.seed` 0) for `--steps` steps,
in its own process and output directory; `cuda2` is `torchrun --nproc_per_node 2 -m grpo train`, whose prompts per
step are split over the two ranks (the run is world-size invariant: same prompts, same groups). Reported per run:
the reward curve (`reward/total/mean` per step), the held-out accuracy at the end (`grpo eval` on the embedded
held-out set), seconds per step after the first, and the largest reward difference to the CPU run at any step.

GPU kernels are not bit-identical to the CPU's, so the curves agree in trend, not in value: a CUDA run whose final
accuracy is within a few points of the CPU's, and whose rewards rise alike, shows the CUDA path trains. Prints a
Markdown table and writes bench/results/<out>.json (the curves included) for docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, machine, print_table  # noqa: E402

#: run name -> (launcher argv prefix, model.device, GPUs needed)
RUNS = {
    "cpu": ([sys.executable, "-m", "grpo"], "cpu", 0),
    "cuda1": ([sys.executable, "-m", "grpo"], "cuda", 1),
    "cuda2": ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "grpo"],
              "cuda", 2),
}


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def read_curve(out: Path) -> list[dict]:
    """The run's metrics.jsonl records that carry a step's reward (rank 0 writes them)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward/total/mean" in r]


def held_out_accuracy(out: Path, device: str) -> float | None:
    """`grpo eval` (greedy) of the run's final checkpoint on the embedded held-out problems: its printed accuracy."""
    ckpts = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not ckpts:
        return None
    cmd = [sys.executable, "-m", "grpo", "eval", "--model", str(ckpts[-1]), "--device", device]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    found = [line.split()[1] for line in proc.stdout.splitlines() if line.split()[:1] == ["accuracy"]]
    return float(found[0]) if proc.returncode == 0 and found else None


def run_one(name: str, steps: int, work: Path) -> dict:
    launcher, device, _ = RUNS[name]
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*launcher, "train", "--train.max_steps", str(steps), "--train.output_dir", str(out),
           "--model.device", device, "--train.save_steps", str(steps)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"run": name, "failed": tail[0], "wall_s": wall}
    curve = read_curve(out)
    times = [r["time/step_s"] for r in curve[1:] if "time/step_s" in r]
    return {"run": name, "wall_s": wall, "rewards": [r["reward/total/mean"] for r in curve],
            "s_per_step": sum(times) / len(times) if times else None,
            "accuracy": held_out_accuracy(out, device)}


def compare(results: list[dict]) -> list[dict]:
    """Table rows: each run's final reward, accuracy, s/step, and its largest reward gap to the CPU curve."""
    cpu = next((r for r in results if r["run"] == "cpu" and "rewards" in r), None)
    rows = []
    for r in results:
        if "failed" in r:
            rows.append({"run": r["run"], "final reward": "failed", "accuracy": r["failed"][:60]})
            continue
        gap = (max(abs(a - b) for a, b in zip(r["rewards"], cpu["rewards"]))
               if cpu is not None and r is not cpu and r["rewards"] else None)
        rows.append({"run": r["run"], "steps": len(r["rewards"]), "final reward": round(r["rewards"][-1], 3),
                     "accuracy": r["accuracy"], "s/step": None if r["s_per_step"] is None else round(r["s_per_step"], 3),
                     "max |reward - cpu|": None if gap is None else round(gap, 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="cpu,cuda1,cuda2", help="comma-separated: cpu, cuda1, cuda2")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="CPU only, 2 steps: checks the script")
    parser.add_argument("--out", default="gpu_check", help="results file in bench/results (no .json)")
    args = parser.parse_args()
    names = ["cpu"] if args.quick else [n.strip() for n in args.runs.split(",") if n.strip()]
    steps = 2 if args.quick else args.steps
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        parser.error(f"--runs: unknown run(s) {', '.join(unknown)} (known: {', '.join(RUNS)})")
    gpus = gpu_count()
    skipped = [n for n in names if RUNS[n][2] > gpus]
    for n in skipped:
        print(f"gpu_check: skipping {n}: needs {RUNS[n][2]} GPU(s), this machine has {gpus}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="grpo-gpu-check-") as tmp:
        results = [run_one(n, steps, Path(tmp)) for n in names if n not in skipped]
    rows = compare(results)
    print_table(rows, list(rows[0]) if rows else ["run"])
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{args.out}.json").write_text(json.dumps(
            {"machine": machine(), "gpus": gpus, "steps": steps, "skipped": skipped, "runs": results,
             "table": rows}, indent=1))
    if any("failed" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
