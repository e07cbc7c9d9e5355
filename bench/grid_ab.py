"""Our side of the shape grid (bench/grid.py --no-trl) for two checkouts, alternated point by point: did a change
move our speed or memory? TRL's side does not change with our code, so each point's ratio to TRL is taken against
a committed grid of the same host (`--trl-from`).

    git worktree add /tmp/base <old commit>
    .venv/bin/python bench/grid_ab.py --old /tmp/base [--points base,h64-l2,...] [--trl-from grid_xeon] --out grid_ab
    .venv/bin/python bench/grid_ab.py --old /tmp/base --merge-only      # tables from runs already made

Each (point, side) is one fresh `bench/grid.py --points P --no-trl --out gridcmp_<side>_<P>` run in that checkout
(writing its own bench/results there); old and new alternate so that a drift of the machine hits both alike.
Prints a Markdown table (s/step, peak MiB, rollout / generate, new / old, and the ratio to TRL before and after)
and writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, machine, print_table  # noqa: E402
from bench.grid import POINTS  # noqa: E402


def run_side(root: Path, side: str, point: str) -> None:
    cmd = [sys.executable, "bench/grid.py", "--points", point, "--no-trl", "--out", f"gridcmp_{side}_{point}",
           "--plot", f"/tmp/grid_ab_{side}.png"]
    subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True)


def our_row(root: Path, side: str, point: str) -> dict | None:
    path = root / "bench" / "results" / f"gridcmp_{side}_{point}.json"
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["rows"]
    return next((r for r in rows if r.get("point") == point), None)


def trl_rows(name: str) -> dict[str, dict]:
    path = RESULTS / f"{name}.json"
    return {r["point"]: r for r in json.loads(path.read_text())["rows"]} if path.exists() else {}


def table(old_root: Path, points: list[str], trl_from: str) -> list[dict]:
    trl, out = trl_rows(trl_from), []
    for p in points:
        old, new = our_row(old_root, "old", p), our_row(ROOT, "new", p)
        if old is None or new is None:
            continue
        t = trl.get(p, {})
        row = {"point": p, "old s/step": round(old["ours_step_s"], 2), "new s/step": round(new["ours_step_s"], 2),
               "new / old": round(new["ours_step_s"] / old["ours_step_s"], 2),
               "old MiB": round(old["ours_peak_mb"]), "new MiB": round(new["ours_peak_mb"]),
               "old rollout / generate": round(old["rollout_vs_generate"], 2),
               "new rollout / generate": round(new["rollout_vs_generate"], 2)}
        if t.get("trl_step_s"):
            row["ratio to TRL, committed"] = round(t["ours_step_s"] / t["trl_step_s"], 2)
            row["ratio to TRL, old"] = round(old["ours_step_s"] / t["trl_step_s"], 2)
            row["ratio to TRL, new"] = round(new["ours_step_s"] / t["trl_step_s"], 2)
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the other checkout (a git worktree of the old commit)")
    parser.add_argument("--points", default=",".join(p for p in POINTS if p != "len1024"))
    parser.add_argument("--trl-from", default="grid_xeon", help="committed grid (bench/results, no .json) of this "
                        "host whose TRL s/step the ratios use")
    parser.add_argument("--merge-only", action="store_true", help="only tabulate runs already made")
    parser.add_argument("--out", default="grid_ab")
    args = parser.parse_args()
    old_root, points = Path(args.old).resolve(), [p.strip() for p in args.points.split(",") if p.strip()]
    if not args.merge_only:
        for p in points:
            run_side(old_root, "old", p)
            run_side(ROOT, "new", p)
    rows = table(old_root, points, args.trl_from)
    markdown = print_table(rows, list(rows[0]) if rows else ["point"])
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"machine": machine(), "old": str(old_root), "trl_from": args.trl_from, "rows": rows, "markdown": markdown},
        indent=1))


if __name__ == "__main__":
    main()
