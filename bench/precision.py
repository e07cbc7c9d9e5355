"""`train.precision` bf16 against fp32: seconds per GRPO step, stage by stage, and peak memory.

    .venv/bin/python bench/precision.py [--configs qwen2-100m] [--steps 6] [--rounds 3] [--threads N]

Each run is `grpo train` in a fresh process on the configuration of bench/speed.py and
bench/trl_compare.py (qwen2-100m: a random 100M Qwen2 with a 32k vocabulary, G = 8, 2 prompts per
step, 64 new tokens, 2 threads, beta = 0.04, the embedded arithmetic prompts, the trainer's defaults
otherwise: `cpu.cpu_matmul: auto`, token-budget micro-batches). The precisions alternate
(fp32, bf16, then bf16, fp32, ...) `--rounds` times each. Per run: the median over steps 2.. of
metrics.jsonl's time/rollout_s (sampling), time/experience_s (sampling + rewards + reference pass),
time/update_s and time/step_s; the peak RSS is ru_maxrss of the process (model loading included).
Each number is then the median over rounds; the ratios are fp32 / bf16 (> 1: bf16 faster). The
machine's 1-minute load average is recorded before every run (other jobs share the cores; `--threads 1`
is far less sensitive to them than two threads, whose OpenMP barriers stall when a core is taken).
Writes bench/results/precision.json (with the CPU's model and torch's vector ISA: bf16 is fast only
with AVX-512 BF16 / AMX; on an AVX2-only CPU its matmuls are emulated, several times slower than float32).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STAGES = ("rollout_s", "experience_s", "update_s", "step_s")

CHILD = r"""
import json, resource, sys
from grpo.config import build_config
from grpo.api.trainer import train
spec = json.loads(sys.argv[1])
cfg = build_config(overrides={
    "model.path": spec["model"], "data.dataset": spec["data"], "data.shuffle": False,
    "reward.functions": ["accuracy", "format"], "rollout.num_generations": spec["G"],
    "rollout.max_new_tokens": spec["new_tokens"], "algorithm.beta": spec["beta"], "optim.lr": spec["lr"],
    "train.prompts_per_step": spec["prompts"], "train.max_steps": spec["steps"], "cpu.num_threads": spec["threads"],
    "train.precision": spec["precision"], "train.output_dir": spec["out"], "train.save_final": False,
    "log.progress_bar": False})
train(cfg)
rows = [json.loads(line) for line in open(spec["out"] + "/metrics.jsonl")]
stages = {k: [r["time/" + k] for r in rows] for k in ("rollout_s", "experience_s", "update_s", "step_s")}
print(json.dumps({**stages, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(spec: dict) -> dict:
    """One `grpo train` run in a fresh process: per-step stage times and the peak RSS."""
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench/precision.py: the {spec['precision']} run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def order(rounds: int) -> list[str]:
    """fp32, bf16, bf16, fp32, fp32, bf16, ...: each precision first in half of the rounds."""
    return [p for r in range(rounds) for p in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32"))]


def compare(name: str, steps: int, rounds: int, tmp: Path, threads: int = 0) -> dict:
    """Both precisions on one configuration (`threads` 0 = the configuration's); returns one row of
    medians and fp32 / bf16 ratios."""
    from bench.common import median
    from bench.speed import model_dir
    from bench.trl_compare import BETA, CONFIGS, write_prompts

    c = {**CONFIGS[name], **({"threads": threads} if threads else {})}
    data = tmp / "prompts.jsonl"
    write_prompts(data, 4096)
    runs: dict[str, list[dict]] = {"fp32": [], "bf16": []}
    for i, precision in enumerate(order(rounds)):
        spec = {**c, "model": str(model_dir(name)), "data": str(data), "beta": BETA, "steps": steps,
                "precision": precision, "out": str(tmp / f"{name}-{precision}-{i}")}
        load = os.getloadavg()[0]
        out = {**run(spec), "load_before": load}
        print(f"  {name} {precision} (load {load:.1f}): step_s {[round(s, 2) for s in out['step_s']]}, "
              f"update_s {[round(s, 2) for s in out['update_s']]}, peak {out['peak_rss_mb']:.0f} MiB", flush=True)
        runs[precision].append(out)
    row = {"config": name, "threads": c["threads"], "G": c["G"], "prompts": c["prompts"], "new_tokens": c["new_tokens"]}
    for precision, outs in runs.items():
        for stage in STAGES:
            row[f"{precision}_{stage}"] = median([median(o[stage][1:]) for o in outs])
        row[f"{precision}_peak_mb"] = median([o["peak_rss_mb"] for o in outs])
        row[f"{precision}_runs"] = outs
    for stage in STAGES:
        row[f"speedup_{stage}"] = row[f"fp32_{stage}"] / row[f"bf16_{stage}"]
    row["memory_ratio"] = row["bf16_peak_mb"] / row["fp32_peak_mb"]
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| config | precision | rollout s | experience s | update s | step s | peak RSS MiB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        for p in ("fp32", "bf16"):
            lines.append(f"| {r['config']} | {p} | {r[f'{p}_rollout_s']:.2f} | {r[f'{p}_experience_s']:.2f} | "
                         f"{r[f'{p}_update_s']:.2f} | {r[f'{p}_step_s']:.2f} | {r[f'{p}_peak_mb']:.0f} |")
        lines.append(f"| {r['config']} | **fp32 / bf16** | {r['speedup_rollout_s']:.2f} | "
                     f"{r['speedup_experience_s']:.2f} | {r['speedup_update_s']:.2f} | **{r['speedup_step_s']:.2f}** | "
                     f"bf16 / fp32 {r['memory_ratio']:.2f} |")
    return "\n".join(lines)


def cpu() -> dict:
    """The CPU's model name and the widest vector ISA torch dispatches to: bf16 speed depends on it (the
    AVX-512 BF16 GEMMs of oneDNN; on an AVX2-only CPU bf16 matmuls are emulated and slower than float32)."""
    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "") if Path("/proc/cpuinfo").exists() else ""
    return {"model": model, "torch_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    from bench.common import print_table, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="qwen2-100m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = the configuration's: 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [compare(name, args.steps, args.rounds, Path(tmp), args.threads) for name in args.configs.split(",")]
    print_table(rows, ["config", "threads", *(f"speedup_{s}" for s in STAGES), "fp32_peak_mb", "bf16_peak_mb",
                       "memory_ratio"])
    print(markdown(rows))
    path = write_results("precision", rows, {"steps": args.steps, "rounds": args.rounds, "cpu": cpu(),
                                             "markdown": markdown(rows)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
