"""Peak memory of one GRPO step against completion length, and the memory planner's choice.

    .venv/bin/python bench/long_completions.py [--lengths 256,1024,2048,4096] [--budget-run 4096:4.0]

Each point runs one `grpo train` step (grpo.Trainer, the CLI's path) in a fresh process on the locally built
100M Qwen2 (bench/common.py, 32k vocabulary), full fine-tuning with beta = 0.04 (a frozen reference copy),
G = 2, 1 prompt, and exactly `length` new tokens per completion (EOS suppressed in the sampler, so every row
has the same length). The child reports its peak RSS (ru_maxrss) and the peaks of its phases, sampled every
2 ms: model load and setup, experience (rollout + reference pass), update (forward, backward, AdamW).

Rows: for every length, the planner's plan under the default budget (train.memory_budget_gib = 0: a share
of the memory available) unless `--budget` is given; `--force ckpt=off|on` pins the plan's checkpointing.
The slope (MiB per 1k tokens) and the quadratic coefficient are least-squares fits of peak RSS against
length over the points of one plan. `--budget-run L:GIB` adds a run whose budget is below the
unconstrained peak at length L. Timings are not results (2 cores shared with other work).
Writes bench/results/long_completions.json.
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

from bench.common import build_bench_model, print_table, write_results  # noqa: E402

CHILD = r"""
import json, random, resource, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from bench.common import PeakRSS
from grpo import events
import grpo.training.experience as experience

model_dir, length, overrides = sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
rss = PeakRSS()
phases = {}
marks = {"t": time.perf_counter()}

def listener(point, step):
    if point in ("rollout", "update"):
        phases["experience" if point == "rollout" else "update"] = rss.peak()
        rss.reset()

import grpo.rollout.engines.native as native
_sample = native.sample
def fixed_length(model, prompts, params, **kwargs):   # exactly `length` tokens per row: EOS never ends a completion
    return _sample(model, prompts, params.with_(stop_token_ids=(-1,)), **kwargs)
native.sample = fixed_length

plan = {}
import grpo.training.loop as loop
_update = loop.update
def spy(state, batch, cfg, step, world, plan_):
    plan.update(plan_.as_dict())
    return _update(state, batch, cfg, step, world, plan_)
loop.update = spy

def noisy(completions, **kwargs):            # G distinct rewards: non-zero advantages, a real update
    return [random.random() for _ in completions]

import grpo
config = {"rollout.num_generations": 2, "train.prompts_per_step": 1, "rollout.max_new_tokens": length,
          "train.max_steps": 1, "train.save_final": False, "log.progress_bar": False, "health.enabled": False,
          "log.samples_per_step": 0, "algorithm.beta": 0.04, "optim.lr": 1e-5, **overrides}
trainer = grpo.Trainer(model_dir, reward_funcs=[noisy], train_dataset=[{"prompt": "12+34="}] * 4, config=config)
phases["setup"] = rss.peak()
rss.reset()
events.add_listener(listener)
t0 = time.perf_counter()
trainer.train()
print("RESULT", json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                            "phases_mib": phases, "plan": plan, "step_s": time.perf_counter() - t0}), flush=True)
"""


UPDATE_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from bench.common import PeakRSS
from grpo.config import build_config
from grpo.cpu.heap import set_mmap_threshold
from grpo.cpu.placement import use_cpu_matmul
from grpo.training.cpu_runtime import install_hooks
from grpo.modeling.lean_layers import use_lean_layers
from grpo.modeling.models import load_policy
from grpo.training.update import UpdateSettings, build_optimizer, policy_update
from grpo.types import TrainBatch

model_dir, L, ckpt, lean = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "on", sys.argv[5] == "on"
set_mmap_threshold(build_config().cpu.mmap_threshold_mb)   # as grpo train
rss = PeakRSS()
model, _ = load_policy(model_dir)
use_lean_layers(model, lean)                            # train.lean_layers
install_hooks()                                           # the CPU runtime's model-code hooks
use_cpu_matmul(model, "auto")
cfg = build_config(overrides={"algorithm.beta": 0.0})
opt, sched = build_optimizer(model, cfg.optim, 10)
P, g = 8, torch.Generator().manual_seed(0)
ids = torch.randint(0, 32000, (1, P + L), generator=g)
mask, cm = torch.ones(1, P + L, dtype=torch.long), torch.ones(1, L)
kw = dict(temperature=1.0, micro_batch_size=0, max_grad_norm=1.0, gradient_checkpointing=ckpt)
warm = TrainBatch(ids[:, :P + 4], mask[:, :P + 4], cm[:, :4], torch.ones(1), None, None)
policy_update(model, opt, sched, warm, cfg.algorithm, UpdateSettings(**kw))   # gradients and AdamW state exist from here
base = rss.current()
rss.reset()
policy_update(model, opt, sched, TrainBatch(ids, mask, cm, torch.ones(1), None, None), cfg.algorithm,
              UpdateSettings(**kw))
print("RESULT", json.dumps({"length": L, "ckpt": ckpt, "lean_layers": lean, "base_mib": base, "peak_mib": rss.peak(),
                            "above_steady_state_mib": rss.peak() - base}), flush=True)
"""


def run_update_only(model_dir: Path, length: int, ckpt: str, lean: str = "on") -> dict:
    """Peak RSS of one update on one synthetic row of `length` completion tokens (8-token prompt), above the
    steady state (weights, gradients, AdamW state): the update's activations alone, no rollout. `lean`:
    train.lean_layers on | off."""
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", UPDATE_CHILD, root, str(model_dir), str(length), ckpt, lean],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    return json.loads(line[len("RESULT "):]) if line else {"length": length, "error": proc.stderr[-300:]}


def run_point(model_dir: Path, length: int, overrides: dict, out_dir: Path, threads: int) -> dict:
    """One train step of `length` new tokens in a child process: its peak RSS, phase peaks and plan."""
    overrides = {"train.output_dir": str(out_dir), "cpu.num_threads": threads, **overrides}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", CHILD, root, str(model_dir), str(length), json.dumps(overrides)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-1500:]
        return {"error": tail.strip().splitlines()[-1] if tail.strip() else f"exit {proc.returncode}"}
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def fit(lengths: list[int], peaks: list[float]) -> dict:
    """Least-squares fits of peak (MiB) against length: linear (slope in MiB per 1k tokens) and quadratic
    (its x^2 coefficient in MiB per (1k tokens)^2; ~0 when nothing grows quadratically)."""
    import numpy as np

    x = np.asarray(lengths, dtype=np.float64) / 1000.0
    y = np.asarray(peaks, dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    out = {"slope_mib_per_1k_tokens": float(slope), "intercept_mib": float(intercept),
           "max_linear_residual_mib": float(np.abs(y - (slope * x + intercept)).max())}
    if len(x) >= 3:
        quad = np.polyfit(x, y, 2)
        out["quadratic_mib_per_1k_tokens_sq"] = float(quad[0])
    return out


def row_of(length: int, label: str, r: dict) -> dict:
    if "error" in r:
        return {"length": length, "run": label, "error": r["error"]}
    plan, ph = r["plan"], r["phases_mib"]
    return {"length": length, "run": label, "peak_rss_mib": r["peak_rss_mib"], "setup_mib": ph.get("setup"),
            "experience_mib": ph.get("experience"), "update_mib": ph.get("update"),
            "ckpt": plan.get("gradient_checkpointing"), "mb_tokens": plan.get("micro_batch_tokens"),
            "head_chunk": plan.get("logprob_chunk_size"), "budget_gib": plan.get("budget_gib"),
            "estimate_gib": plan.get("estimate_gib"), "step_s": r["step_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024,2048,4096")
    parser.add_argument("--force", default="", help="pin checkpointing in every run: on | off (empty: the planner)")
    parser.add_argument("--budget", type=float, default=0.0, help="train.memory_budget_gib of every run (0 = auto)")
    parser.add_argument("--budget-run", default="", help="L:GIB: one more run at length L under budget GIB")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--merge", action="store_true", help="add these rows to the existing results file")
    parser.add_argument("--out", default="long_completions", help="results file name in bench/results (no .json)")
    parser.add_argument("--update-only", default="", help="L,L,...: instead, the update alone on one row of L "
                        "tokens, checkpointing off and on (in-process peak above the steady state)")
    parser.add_argument("--lean-layers", default="on", choices=("on", "off"),
                        help="--update-only: train.lean_layers in the child (default on; grpo train's default is off)")
    parser.add_argument("--models-dir", default=os.path.join(tempfile.gettempdir(), "grpo-bench-models"))
    args = parser.parse_args()
    model_dir = build_bench_model("qwen2-100m", args.models_dir)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.update_only:
        rows = [run_update_only(model_dir, int(L), c, args.lean_layers) for c in ("off", "on") for L in args.update_only.split(",")]
        fits = {c: fit([r["length"] for r in rows if r.get("ckpt") == (c == "on")],
                       [r["above_steady_state_mib"] for r in rows if r.get("ckpt") == (c == "on")])
                for c in ("off", "on")}
        print_table(rows, ["length", "ckpt", "base_mib", "peak_mib", "above_steady_state_mib"])
        print(json.dumps(fits))
        print(f"wrote {write_results(args.out, rows, {'model': 'qwen2-100m', 'fits': fits})}")
        return
    overrides: dict = {"train.memory_budget_gib": args.budget}
    if args.force:
        overrides["train.gradient_checkpointing"] = args.force == "on"
    label = f"ckpt={args.force}" if args.force else "planner"
    label += f", budget {args.budget:g} GiB" if args.budget else ", default budget"
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, length in enumerate(lengths):
            rows.append(row_of(length, label, run_point(model_dir, length, overrides, Path(tmp) / str(i), args.threads)))
            print(json.dumps(rows[-1]), flush=True)
        if args.budget_run:
            length, gib = args.budget_run.split(":")
            r = run_point(model_dir, int(length), {"train.memory_budget_gib": float(gib)}, Path(tmp) / "b", args.threads)
            rows.append(row_of(int(length), f"planner, budget {float(gib):g} GiB", r))
            print(json.dumps(rows[-1]), flush=True)
    path = Path(__file__).resolve().parent / "results" / f"{args.out}.json"
    if args.merge and path.is_file():
        rows = json.loads(path.read_text())["rows"] + rows
    fits = {}
    for run in sorted({r["run"] for r in rows}):
        pts = sorted((r["length"], r["peak_rss_mib"]) for r in rows if r["run"] == run and "peak_rss_mib" in r)
        if len({p[0] for p in pts}) >= 2:
            fits[run] = fit([p[0] for p in pts], [p[1] for p in pts])
            for phase in ("update_mib", "experience_mib"):
                ph = sorted((r["length"], r[phase]) for r in rows if r["run"] == run and r.get(phase))
                if len(ph) >= 2:
                    fits[run][phase.replace("_mib", "")] = fit([p[0] for p in ph], [p[1] for p in ph])
    print("model qwen2-100m, 1 step, G=2, 1 prompt, constant-length completions, full fine-tuning, beta=0.04")
    print_table(rows, ["length", "run", "peak_rss_mib", "setup_mib", "experience_mib", "update_mib", "ckpt",
                       "mb_tokens", "head_chunk", "budget_gib", "estimate_gib"])
    for run, f in fits.items():
        print(f"{run}: {json.dumps(f)}")
    out = write_results(args.out, rows, {"model": "qwen2-100m", "G": 2, "prompts": 1, "steps": 1,
                                                   "threads": args.threads, "fits": fits,
                                                   "wall_s": time.perf_counter() - t0})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
