"""How cost grows: our trainer against TRL's GRPOTrainer over a grid of shapes, one factor at a time.

    bash bench/setup_trl.sh                            # once: TRL in bench/.trl-venv (CPU torch)
    .venv/bin/python bench/grid.py [--points base,g16,...] [--steps 3] [--rounds 1] [--no-trl] [--quick] [--out grid]
                                   [--precision fp32|bf16] [--rollout-precision auto|bf16]

The grid varies one factor at a time around a base point: the qwen2-100m shape (hidden 768, 12 layers,
32k vocabulary), G = 8, 2 prompts per step, 64 new tokens, torch's default thread count. The factors:
model shape (hidden 64 to 1024, 2 to 24 layers), vocabulary (256, 32k, 152k), G (4, 8, 16), prompts per
step (2, 16), completion length (32, 64, 256, 1024) and threads (default, 1). `--points` picks a subset
by name (`--list` prints them).

Per point, our run and TRL's alternate (`--rounds` times each, each a fresh process, on the settings of
bench/trl_compare.py: same model directory, prompts, rewards, G, lengths, beta 0.04, AdamW, no
micro-batching); seconds per step are the median over steps 2.. of a run, then over rounds; peak RSS is
ru_maxrss of the process (model loading included on both sides). Our child then times the rollout
against `model.generate` on the same prompts with EOS on (bench/speed.py's `rollout_pair`, two
alternating repeats), which gives the rollout's tokens/s ratio on that shape.

`--precision bf16` runs both trainers in bfloat16 autocast (ours `train.precision: bf16`, TRL's
`GRPOConfig(bf16=True)`), `generate` too; `--rollout-precision bf16` only our sampler (TRL stays float32).

Writes bench/results/grid.json, prints a Markdown table, and plots docs/img/scaling.png: s/step and peak
memory against G, completion length and parameter count, for ours and TRL. Random models seldom emit EOS,
so completions run to the length limit on both sides. `--quick` (2 steps, tiny points only) checks
the script itself in a few minutes; its numbers are not results.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS_DIR = Path(tempfile.gettempdir()) / "grpo-grid-models"
#: The base point; each grid point changes one entry of it.
BASE = dict(hidden=768, layers=12, vocab=32768, G=8, prompts=2, new_tokens=64, threads=0)
#: name -> the entries that differ from BASE (one factor at a time).
POINTS: dict[str, dict] = {
    "base": {},
    "h64-l2": dict(hidden=64, layers=2), "h128-l4": dict(hidden=128, layers=4), "h256-l6": dict(hidden=256, layers=6),
    "h512-l8": dict(hidden=512, layers=8), "h1024-l24": dict(hidden=1024, layers=24),
    "vocab256": dict(vocab=256), "vocab152k": dict(vocab=151936),
    "g4": dict(G=4), "g16": dict(G=16),
    "prompts16": dict(prompts=16),
    "len32": dict(new_tokens=32), "len256": dict(new_tokens=256), "len1024": dict(new_tokens=1024),
    "threads1": dict(threads=1),
}
QUICK = ["h64-l2", "h128-l4"]

OURS_TAIL = r"""
import statistics
rows = [json.loads(line) for line in open(spec["out"] + "/metrics.jsonl")]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
# the rollout against model.generate on the same prompts, EOS on (bench/speed.py), alternating twice
from bench.speed import rollout_pair
from grpo.data.prompts import tokenize_prompts
from bench.common import arithmetic_rows
model, tok = result.model, result.tokenizer
model.generation_config.top_k = None
batch = tokenize_prompts(tok, arithmetic_rows(spec["prompts"], tok, seed=1))
from grpo.modeling.precision import rollout_precision
train_precision = spec.get("precision", "fp32")                 # --precision: both trainers' (TRL: bf16=True)
lowp = rollout_precision(spec.get("overrides", {}).get("rollout.precision", "auto"), train_precision)
pairs = [rollout_pair(model, tok, batch, spec["G"], spec["new_tokens"], i, False, lowp, train_precision)
         for i in range(2)]                                           # generate in TRL's precision
extra = {}
if lowp != train_precision:   # generate under the rollout's autocast too: the like-for-like rollout ratio
    same = [rollout_pair(model, tok, batch, spec["G"], spec["new_tokens"], i, False, lowp, lowp) for i in range(2)]
    extra = {"generate_lowp_tok_s": statistics.median(p[1][1] / p[1][0] for p in same),
             "rollout_lowp_tok_s": statistics.median(p[0][1] / p[0][0] for p in same)}
print(json.dumps({"step_s": [r["time/step_s"] for r in rows], "rollout_s": [r["time/rollout_s"] for r in rows],
                  "update_s": [r["time/update_s"] for r in rows], "peak_rss_mb": peak,
                  "rollout_tok_s": statistics.median(p[0][1] / p[0][0] for p in pairs),
                  "generate_tok_s": statistics.median(p[1][1] / p[1][0] for p in pairs), **extra}))
"""


def point_spec(name: str) -> dict:
    """BASE with the point's changes."""
    return {**BASE, **POINTS[name]}


def shape_config(hidden: int, layers: int) -> dict[str, int]:
    """A Qwen2-style shape of `hidden` x `layers`: heads of 64 (at least 1, 2 for hidden 64), about a
    third as many KV heads, an MLP of 8/3 hidden rounded to 64 (the ratio of the qwen2-100m shape)."""
    heads = max(2, hidden // 64)
    kv = next(k for k in range(max(1, heads // 3), 0, -1) if heads % k == 0)
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=max(64, round(hidden * 8 / 3 / 64) * 64))


def build_model(hidden: int, layers: int, vocab: int, seed: int = 0) -> Path:
    """Build (once) a randomly initialised Qwen2 of this shape and vocabulary; returns its directory."""
    from bench.common import build_qwen2

    return build_qwen2(shape_config(hidden, layers), vocab, MODELS_DIR / f"h{hidden}-l{layers}-v{vocab}", seed)


def params_of(model_dir: Path) -> int:
    from bench.common import count_params

    return count_params(model_dir)


#: Run in each child first: a thread that ends the process (exit status 3) when its RSS passes CAP_MB, so a side
#: whose peak would not fit this machine is reported as such instead of waking the out-of-memory killer.
GUARD = r"""
import os as _os, threading as _threading, time as _time
def _guard(cap_mb):
    while True:
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
        if rss > cap_mb:
            _os.write(2, f"peak RSS passed the grid's cap of {cap_mb:.0f} MiB (85 % of this machine's memory)\n".encode())
            _os._exit(3)
        _time.sleep(0.05)
_threading.Thread(target=_guard, args=(CAP_MB,), daemon=True).start()
"""


def memory_cap_mb() -> float:
    """85 % of this machine's memory (MemTotal), in MiB."""
    with open("/proc/meminfo") as f:
        total_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    return 0.85 * total_kb / 1024


def run_child(python: str, code: str, spec: dict) -> subprocess.CompletedProcess:
    """`code` in a fresh `python` process under the RSS guard, with `spec` (its threads resolved) as argv[1]."""
    threads = spec["threads"] or (os.cpu_count() or 1)         # torch's default: one per core
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    child = {**spec, "threads": threads}
    code = GUARD.replace("CAP_MB", f"{memory_cap_mb():.0f}") + code
    return subprocess.run([python, "-c", code, json.dumps(child)], capture_output=True, text=True, env=env, cwd=ROOT)


def run(side: str, spec: dict) -> dict:
    """One run in a fresh process (ours: also the rollout-vs-generate timing)."""
    from bench.trl_compare import OURS_TRAIN, TRL, TRL_PYTHON

    python = str(TRL_PYTHON) if side == "trl" else sys.executable
    proc = run_child(python, TRL if side == "trl" else OURS_TRAIN + OURS_TAIL, spec)
    if proc.returncode != 0 and side == "trl":          # TRL's own limit (e.g. its peak beyond this machine's memory)
        reason = ("killed by signal 9 (the kernel's out-of-memory killer)" if proc.returncode == -9 else
                  (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:300])
        return {"failed": reason}
    if proc.returncode != 0:
        raise SystemExit(f"bench/grid.py: the {side} run of {spec['name']} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(name: str, steps: int, rounds: int, tmp: Path, with_trl: bool, rollout_precision: str = "auto",
            precision: str = "fp32") -> dict:
    """Both sides on one grid point, alternating; one row of medians and ratios. `rollout_precision`: our
    rollout.precision (TRL's side is unchanged); `precision`: both sides' (ours train.precision, TRL's bf16 flag)."""
    from bench.common import median
    from bench.trl_compare import BETA, write_prompts

    p = point_spec(name)
    data = tmp / "prompts.jsonl"
    if not data.exists():
        write_prompts(data, 4096)
    model = build_model(p["hidden"], p["layers"], p["vocab"])
    sides = ("ours", "trl") if with_trl else ("ours",)
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(rounds):
        for side in sides if r % 2 == 0 else tuple(reversed(sides)):
            spec = {**p, "name": name, "model": str(model), "data": str(data), "beta": BETA, "steps": steps,
                    "lr": 1e-6, "out": str(tmp / f"{name}-{side}-{r}"), "root": str(ROOT),
                    "precision": precision,
                    "overrides": {**({} if precision == "fp32" else {"train.precision": precision}),
                                  **({} if rollout_precision == "auto" else {"rollout.precision": rollout_precision})}}
            t0 = time.perf_counter()
            out = run(side, spec)
            if "failed" in out:
                print(f"  {name} {side} round {r}: failed: {out['failed']} ({time.perf_counter() - t0:.0f} s)", flush=True)
            else:
                print(f"  {name} {side} round {r}: step_s {[round(s, 2) for s in out['step_s']]}, "
                      f"peak {out['peak_rss_mb']:.0f} MiB ({time.perf_counter() - t0:.0f} s)", flush=True)
            runs[side].append(out)
    row = {"point": name, **p, "params": params_of(model), "steps": steps, "rounds": rounds, "precision": precision}
    failed = [o["failed"] for o in runs.get("trl", []) if "failed" in o]
    if failed:                                          # a TRL run that could not finish: recorded, no ratios
        row["trl_failed"] = failed[0]
        runs["trl"] = [o for o in runs["trl"] if "failed" not in o]
        if not runs["trl"]:
            del runs["trl"]
            with_trl = False
    for side, outs in runs.items():
        row[f"{side}_step_s"] = median([median(o["step_s"][1:] or o["step_s"]) for o in outs])
        row[f"{side}_peak_mb"] = median([o["peak_rss_mb"] for o in outs])
        row[f"{side}_runs"] = outs
    ours = runs["ours"]
    row["rollout_tok_s"] = median([o["rollout_tok_s"] for o in ours])
    row["generate_tok_s"] = median([o["generate_tok_s"] for o in ours])
    row["rollout_vs_generate"] = row["rollout_tok_s"] / row["generate_tok_s"]
    if "generate_lowp_tok_s" in ours[0]:               # both sides under the rollout's autocast
        row["rollout_precision"] = rollout_precision
        row["rollout_vs_generate_same_precision"] = (median([o["rollout_lowp_tok_s"] for o in ours])
                                                     / median([o["generate_lowp_tok_s"] for o in ours]))
    if with_trl:
        row["step_ratio"] = row["ours_step_s"] / row["trl_step_s"]
        row["memory_ratio"] = row["ours_peak_mb"] / row["trl_peak_mb"]
    return row


def markdown(rows: list[dict]) -> str:
    """The table of docs/performance.md: one line per grid point."""
    lines = ["| point | params | G | prompts | tokens | threads | ours s/step | TRL s/step | ratio | ours MiB | "
             "TRL MiB | ratio | rollout / generate |", "|" + " --- |" * 13]
    for r in rows:
        trl = "trl_step_s" in r
        if "trl_failed" in r and not trl:
            lines.append(f"| {r['point']} | {r['params'] / 1e6:.1f}M | {r['G']} | {r['prompts']} | {r['new_tokens']} | "
                         f"{r['threads'] or 'default'} | {r['ours_step_s']:.2f} | failed | - | {r['ours_peak_mb']:.0f} | "
                         f"failed | - | {r['rollout_vs_generate']:.2f} |")
            continue
        lines.append(
            f"| {r['point']} | {r['params'] / 1e6:.1f}M | {r['G']} | {r['prompts']} | {r['new_tokens']} | "
            f"{r['threads'] or 'default'} | {r['ours_step_s']:.2f} | {r['trl_step_s']:.2f} | {r['step_ratio']:.2f} | "
            f"{r['ours_peak_mb']:.0f} | {r['trl_peak_mb']:.0f} | {r['memory_ratio']:.2f} | "
            f"{r['rollout_vs_generate']:.2f} |" if trl else
            f"| {r['point']} | {r['params'] / 1e6:.1f}M | {r['G']} | {r['prompts']} | {r['new_tokens']} | "
            f"{r['threads'] or 'default'} | {r['ours_step_s']:.2f} | - | - | {r['ours_peak_mb']:.0f} | - | - | "
            f"{r['rollout_vs_generate']:.2f} |")
    if any("rollout_vs_generate_same_precision" in r for r in rows):   # --rollout-precision: the like-for-like ratio
        lines[0] += " rollout / generate, both in the rollout's precision |"
        lines[1] += " --- |"
        lines[2:] = [f"{line} {r['rollout_vs_generate_same_precision']:.2f} |" if "rollout_vs_generate_same_precision" in r
                     else f"{line} - |" for line, r in zip(lines[2:], rows)]
    return "\n".join(lines)


def series(rows: list[dict], factor: str, names: list[str]) -> list[dict]:
    """The rows of one factor's sweep (the base point included), sorted by that factor."""
    chosen = [r for r in rows if r["point"] in names]
    return sorted(chosen, key=lambda r: r[factor])


def plot(rows: list[dict], path: Path) -> None:
    """docs/img/scaling.png: s/step (top) and peak RSS (bottom) against G, completion length and parameter
    count, ours and TRL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [("G", ["g4", "base", "g16"], "G (completions per prompt)"),
              ("new_tokens", ["len32", "base", "len256", "len1024"], "new tokens per completion"),
              ("params", ["h64-l2", "h128-l4", "h256-l6", "h512-l8", "base", "h1024-l24"], "parameters")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for col, (factor, names, label) in enumerate(sweeps):
        data = series(rows, factor, names)
        if not data:
            continue
        for row, (key, ylabel) in enumerate((("step_s", "seconds per step"), ("peak_mb", "peak RSS (MiB)"))):
            ax = axes[row][col]
            for side, style in (("ours", "o-"), ("trl", "s--")):
                have = [r for r in data if f"{side}_{key}" in r]         # a TRL run that failed has no point
                if have:
                    ax.plot([r[factor] for r in have], [r[f"{side}_{key}"] for r in have], style,
                            label="grpo" if side == "ours" else "TRL")
            ax.set_xscale("log")
            if key == "step_s":
                ax.set_yscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle("Cost per GRPO step against G, completion length and model size (one factor at a time)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    from bench.common import write_results
    from bench.trl_compare import TRL_PYTHON

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=",".join(POINTS), help="comma-separated grid points (--list)")
    parser.add_argument("--steps", type=int, default=3, help="steps per run (the first is the warm-up)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per side and point, alternating")
    parser.add_argument("--no-trl", action="store_true", help="our side only (no bench/.trl-venv needed)")
    parser.add_argument("--quick", action="store_true", help="2 steps on the tiny points: checks the script only")
    parser.add_argument("--list", action="store_true", help="print the grid points and exit")
    parser.add_argument("--rollout-precision", default="auto", help="our rollout.precision (bf16: a bf16 sampler "
                        "beside the fp32 update; the rollout is then also timed against generate under bf16 autocast)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="both trainers' precision: ours train.precision, TRL's GRPOConfig(bf16=...); the rollout "
                        "and generate then both run under it (default fp32, like for like)")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "img" / "scaling.png"))
    parser.add_argument("--out", default="grid", help="results file in bench/results (no .json); the plot is "
                        "drawn only for the default, so a re-run of a few points keeps the full grid's files")
    args = parser.parse_args()
    if args.list:
        for name in POINTS:
            print(f"{name:10s} {point_spec(name)}")
        return
    names = QUICK if args.quick else args.points.split(",")
    unknown = [n for n in names if n not in POINTS]
    if unknown:
        raise SystemExit(f"bench/grid.py: unknown point(s) {unknown}; --list shows them")
    with_trl = not args.no_trl
    if with_trl and not TRL_PYTHON.is_file():
        raise SystemExit(f"{TRL_PYTHON} not found: run `bash bench/setup_trl.sh` first (or --no-trl)")
    steps = 2 if args.quick else args.steps
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name in names:
            rows.append(measure(name, steps, args.rounds, Path(tmp), with_trl, args.rollout_precision, args.precision))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
            if not args.quick:                       # after each point, so a stopped grid keeps what it measured
                write_results(args.out, rows, {"steps": steps, "rounds": args.rounds, "base": BASE, "partial": True,
                                             "load_avg": os.getloadavg()})
    table = markdown(rows)
    print(table)
    extra = {"steps": steps, "rounds": args.rounds, "base": BASE, "wall_s": time.perf_counter() - start,
             "rollout_precision": args.rollout_precision, "precision": args.precision,
             "load_avg": os.getloadavg(), "markdown": table, "quick": args.quick}
    if with_trl:
        extra["trl"] = subprocess.run([str(TRL_PYTHON), "-c", "import trl; print(trl.__version__)"],
                                      capture_output=True, text=True).stdout.strip()
    name = "grid_quick" if args.quick else args.out
    print(f"wrote {write_results(name, rows, extra)}")
    if not args.quick and args.out == "grid":
        plot(rows, Path(args.plot))
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
