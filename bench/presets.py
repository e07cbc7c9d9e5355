"""Every algorithm preset on the embedded demo task, for the same number of steps.

    .venv/bin/python bench/presets.py [--steps 100] [--jobs 2] [--presets grpo dapo ...]

Each preset runs `grpo demo --algorithm NAME` (the demo's rollout and optimizer settings, the
preset's algorithm settings) in its own process with one torch thread. Reports held-out greedy
accuracy after training, the mean training reward and completion length over the last 10 steps,
and seconds per step. Writes bench/results/presets.json and bench/results/presets.md; a run of some presets
keeps the earlier rows of the others (same --steps and --eval-problems).
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

from bench.common import RESULTS, print_table, write_results  # noqa: E402
from grpo.config.presets import PRESETS  # noqa: E402


def run_preset(name: str, steps: int, eval_problems: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "grpo", "demo", "--out", str(out), "--steps", str(steps),
           "--eval-problems", str(eval_problems), "--algorithm.preset", name, "--log.progress_bar", "false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"bench/presets.py: preset {name} failed:\n{proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-10:]
    mean = lambda key: sum(r[key] for r in last if r.get(key) is not None) / max(1, sum(r.get(key) is not None for r in last))  # noqa: E731
    return {"preset": name, "heldout_acc_before": summary["before"]["accuracy"],
            "heldout_acc": summary["after"]["accuracy"], "heldout_length": summary["after"]["completion_length"],
            "train_reward": mean("reward/total/mean"), "train_length": mean("completion/length_mean"),
            "s_per_step": sum(r["time/step_s"] for r in records) / len(records)}


def merged_with_earlier(rows: list[dict], args) -> list[dict]:
    """A run of some presets keeps the other presets' rows of bench/results/presets.json when they were measured
    with the same steps and evaluation size (this run's rows replace theirs), in PRESETS order."""
    path = RESULTS / "presets.json"
    if not path.is_file():
        return rows
    earlier = json.loads(path.read_text())
    if (earlier.get("steps"), earlier.get("eval_problems")) != (args.steps, args.eval_problems):
        return rows
    by_name = {r["preset"]: r for r in earlier.get("rows", [])} | {r["preset"]: r for r in rows}
    return [by_name[name] for name in PRESETS if name in by_name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-problems", type=int, default=256)
    parser.add_argument("--jobs", type=int, default=2, help="presets run side by side (one thread each)")
    parser.add_argument("--presets", nargs="*", default=list(PRESETS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda n: run_preset(n, args.steps, args.eval_problems, Path(tmp) / n), args.presets))
    rows = merged_with_earlier(rows, args)
    columns = ["preset", "heldout_acc", "heldout_length", "train_reward", "train_length", "s_per_step"]
    print(f"embedded demo task, {args.steps} GRPO steps per preset, held-out greedy accuracy on "
          f"{args.eval_problems} problems (base policy: {rows[0]['heldout_acc_before']:.3f})")
    table = print_table(rows, columns)
    path = write_results("presets", rows, {"steps": args.steps, "eval_problems": args.eval_problems,
                                           "jobs": args.jobs})
    (RESULTS / "presets.md").write_text(table + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
