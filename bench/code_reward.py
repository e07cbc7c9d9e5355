"""Throughput of the code_execution reward: sandboxed programs per second, pool vs one at a time.

    .venv/bin/python bench/code_reward.py [--programs 64] [--repeats 2]

Scores `--programs` small completions (half stdin/stdout with one test, half a function with three
asserts -- one sandboxed run each) with one worker and with a pool of os.cpu_count() workers, under
the detected isolation and under the fallback without namespaces; a bare `python -I -S` launch per
program gives the floor. Writes bench/results/code_reward.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_table, write_results  # noqa: E402
from grpo.rewards.code import make_code_execution  # noqa: E402
from grpo.rewards.sandbox import Isolation, detect_isolation  # noqa: E402

IO_PROGRAM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ASSERT_PROGRAM = "```python\ndef add(a, b):\n    return a + b\n```"
ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(20, 22) == 42"]


def workload(n: int) -> tuple[list[str], list]:
    """`n` completions and their tests: alternately stdin/stdout and assert style, all correct."""
    completions, tests = [], []
    for i in range(n):
        if i % 2:
            completions.append(ASSERT_PROGRAM)
            tests.append(ASSERTS)
        else:
            completions.append(IO_PROGRAM)
            tests.append([{"input": f"{i} {i + 1}", "output": str(2 * i + 1)}])
    return completions, tests


def time_reward(n: int, workers: int, isolation: Isolation, repeats: int) -> float:
    """Best wall time over `repeats` of scoring the workload (every reward must be 1.0)."""
    completions, tests = workload(n)
    fn = make_code_execution(timeout=5.0, workers=workers, isolation=isolation)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        rewards = fn(["p"] * n, completions, tests=tests)
        best = min(best, time.perf_counter() - start)
        assert rewards == [1.0] * n, rewards
    return best


def time_bare(n: int, repeats: int) -> float:
    """Floor: launching `python -I -S -c pass` n times, one at a time."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    detected, cpus = detect_isolation(), os.cpu_count() or 1
    modes = {"detected": detected, "no-namespaces": Isolation(False, detected.cgroup)}
    rows = [{"isolation": "none (bare python -I -S)", "mode": "one at a time", "workers": 1,
             "seconds": time_bare(args.programs, args.repeats)}]
    for name, iso in modes.items():
        for mode, workers in (("one at a time", 1), ("pool", cpus)):
            rows.append({"isolation": f"{name}: {iso.describe()}", "mode": mode, "workers": workers,
                         "seconds": time_reward(args.programs, workers, iso, args.repeats)})
    for row in rows:
        row.update(programs=args.programs, programs_per_s=args.programs / row["seconds"],
                   ms_per_program=1000 * row["seconds"] / args.programs)
    print_table(rows, ["isolation", "mode", "workers", "programs", "seconds", "programs_per_s", "ms_per_program"])
    path = write_results("code_reward", rows, {"programs": args.programs, "repeats": args.repeats,
                                               "detected_isolation": detected.describe()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
