"""The reference policy's weights in memory or in a file between reference passes (`train.ref_offload`).

    .venv/bin/python bench/ref_offload.py [--points base,g4,...] [--steps 3] [--rounds 2] [--out ref_offload]

On the shape grid's points (bench/grid.py: the same models, prompts and settings, which are those of
bench/trl_compare.py, beta 0.04), `grpo train` runs with `train.ref_offload: none` and with the default (auto,
which on the CPU is disk for a reference of >= 64 MiB), alternating, each in a fresh process under the grid's
RSS guard. Per run: seconds per step (median of steps 2..), the update's and the experience phase's seconds
(rollout, reference pass, rewards) and the process's peak RSS (ru_maxrss, model loading included). Prints a
table and writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The grid's points where peak memory did not reach 0.8x TRL's (the floor of weights, reference, gradients and
#: AdamW's moments), and the base point.
DEFAULT_POINTS = ["base", "g4", "len32", "vocab256", "vocab152k", "h1024-l24"]

TAIL = r"""
rows = [json.loads(line) for line in open(spec["out"] + "/metrics.jsonl")]
print(json.dumps({k: [r[f"time/{k}"] for r in rows] for k in ("step_s", "update_s", "experience_s")}
                 | {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def one_run(spec: dict) -> dict:
    from bench.grid import run_child
    from bench.trl_compare import OURS_TRAIN

    proc = run_child(sys.executable, OURS_TRAIN + TAIL, spec)
    if proc.returncode != 0:
        raise SystemExit(f"bench/ref_offload.py: the run {spec['name']} ({spec['overrides']}) failed:\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(name: str, steps: int, rounds: int, tmp: Path) -> dict:
    from bench.common import median
    from bench.grid import build_model, params_of, point_spec
    from bench.trl_compare import BETA, write_prompts

    p = point_spec(name)
    data = tmp / "prompts.jsonl"
    if not data.exists():
        write_prompts(data, 4096)
    model = build_model(p["hidden"], p["layers"], p["vocab"])
    modes = ("none", "auto")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else tuple(reversed(modes)):
            spec = {**p, "name": name, "model": str(model), "data": str(data), "beta": BETA, "steps": steps,
                    "lr": 1e-6, "out": str(tmp / f"{name}-{mode}-{r}"), "root": str(ROOT),
                    "overrides": {"train.ref_offload": mode}}
            t0 = time.perf_counter()
            out = one_run(spec)
            print(f"  {name} ref_offload={mode} round {r}: step_s {[round(s, 2) for s in out['step_s']]}, "
                  f"peak {out['peak_rss_mb']:.0f} MiB ({time.perf_counter() - t0:.0f} s)", flush=True)
            runs[mode].append(out)
    row = {"point": name, **p, "params": params_of(model), "steps": steps, "rounds": rounds}
    for mode, outs in runs.items():
        for key in ("step_s", "update_s", "experience_s"):
            row[f"{mode}_{key}"] = median([median(o[key][1:] or o[key]) for o in outs])
        row[f"{mode}_peak_mb"] = median([o["peak_rss_mb"] for o in outs])
        row[f"{mode}_runs"] = outs
    row["peak_saved_mb"] = row["none_peak_mb"] - row["auto_peak_mb"]
    row["step_ratio"] = row["auto_step_s"] / row["none_step_s"]
    row["experience_ratio"] = row["auto_experience_s"] / row["none_experience_s"]
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| point | params | s/step none | s/step auto | ratio | experience s none / auto | peak MiB none | "
             "peak MiB auto | saved MiB |", "|" + " --- |" * 9]
    for r in rows:
        lines.append(f"| {r['point']} | {r['params'] / 1e6:.1f}M | {r['none_step_s']:.2f} | {r['auto_step_s']:.2f} | "
                     f"{r['step_ratio']:.2f} | {r['none_experience_s']:.2f} / {r['auto_experience_s']:.2f} | "
                     f"{r['none_peak_mb']:.0f} | {r['auto_peak_mb']:.0f} | {r['peak_saved_mb']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    from bench.common import write_results
    from bench.grid import POINTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default=",".join(DEFAULT_POINTS), help=f"grid points ({', '.join(POINTS)})")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="ref_offload")
    args = ap.parse_args()
    names = [n.strip() for n in args.points.split(",") if n.strip()]
    unknown = [n for n in names if n not in POINTS]
    if unknown:
        raise SystemExit(f"bench/ref_offload.py: unknown point(s) {unknown}; the grid's are {', '.join(POINTS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows.append(measure(name, args.steps, args.rounds, Path(tmp)))
    table = markdown(rows)
    print(table)
    path = write_results(args.out, rows, {"markdown": table})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
