"""Bit-exact at torch's default thread count.

With two or more CPU threads the prompt-shared forward used to index its KV cache out to the G rows
with ``keys[inverse]``, whose backward (``index_put_`` with ``accumulate=True``) adds the rows'
gradients into the shared prompt row with atomic adds in whatever order the threads run: two
identical steps differed by ~1e-9 in the gradients, and a killed-and-resumed run did not end where an
uninterrupted one did. These runs are sized so that the old backward did vary (16 prompts x 8 rows
of the 4-layer embedded architecture: 128 x 2 x ~12 x 32 cache values per layer, above the size at
which torch runs that backward on several threads; the micro model's batches were too small to show it).
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.run_helpers import (ROOT, assert_same_run, final_weights, make_micro_dir, make_reward, records,
                               run_in_process, run_subprocess, tiny_config, train_command)

#: Large enough that the old cache expansion's backward ran on several threads (see the module docstring).
SHAPE = {"train.prompts_per_step": 16, "rollout.num_generations": 8}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The embedded policy's architecture ("small", 0.8M parameters) and a reward that varies in a group."""
    root = tmp_path_factory.mktemp("determinism")
    return make_micro_dir(root / "small", size="small"), make_reward(root)


def default_threads_config(model_dir: Path, reward: str, out: Path, **over) -> dict:
    """:func:`tiny_config` without `cpu.num_threads`: torch's own thread count decides."""
    flat = tiny_config(model_dir, reward, out, **{**SHAPE, **over})
    flat.pop("cpu.num_threads")
    return flat


class threads:
    """Run the block with torch at `count` threads, then restore the previous count."""

    def __init__(self, count: int):
        self.count, self.previous = count, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.count)

    def __exit__(self, *exc):
        torch.set_num_threads(self.previous)


def test_two_runs_at_two_threads_end_with_identical_weights(env, tmp_path):
    with threads(2):
        a = run_in_process(default_threads_config(*env, tmp_path / "a", **{"train.max_steps": 2}))
        b = run_in_process(default_threads_config(*env, tmp_path / "b", **{"train.max_steps": 2}))
    wa, wb = final_weights(a.checkpoint), final_weights(b.checkpoint)
    assert wa.keys() == wb.keys() and wa
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []          # bit for bit, every tensor
    assert records(tmp_path / "a") == records(tmp_path / "b")
    state = json.loads((a.checkpoint / "trainer_state.json").read_text())
    assert state["num_threads"] == 2


def kill_when_logged(flat: dict, steps_logged: int, delay: float) -> int:
    """Start a run at torch's default thread count, SIGKILL it `delay` s after its metrics.jsonl holds
    `steps_logged` lines (a moment chosen by the clock, not by a hook); returns the exit code."""
    argv, env = train_command(flat, omp_threads=None)
    metrics = Path(flat["train.output_dir"]) / "metrics.jsonl"
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.is_file() and metrics.read_text().count("\n") >= steps_logged:
            time.sleep(delay)
            break
        time.sleep(0.01)
    proc.kill()
    return proc.wait()


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_is_bit_identical_at_default_threads(env, tmp_path):
    """20 runs of 4 steps at torch's default thread count, each SIGKILLed once and resumed: 14 at every
    hook point of every step, in random order, 6 at a random moment of a random step. Each ends bit for
    bit like one uninterrupted run (weights and metrics). The killed runs and the reference are new
    processes; the resumes run in this one at the same thread count (a process start costs ~4 s)."""
    steps = 4
    ref = tmp_path / "reference"
    proc = run_subprocess(default_threads_config(*env, ref, **{"train.max_steps": steps}), omp_threads=None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    default = json.loads((ref / f"checkpoint-{steps}" / "trainer_state.json").read_text())["num_threads"]
    hooks = [f"{point}:{step}" for point in ("rollout", "update", "step") for step in range(1, steps + 1)]
    hooks += [f"save:{step}" for step in range(2, steps + 1, 2)]           # save_steps = 2
    rng = random.Random(15)
    trials = [("hook", point) for point in rng.sample(hooks, len(hooks))]
    trials += [("clock", (rng.randint(1, steps - 2), rng.uniform(0.0, 0.3))) for _ in range(20 - len(hooks))]
    for index, (kind, where) in enumerate(trials):
        out = tmp_path / f"trial{index}"
        flat = default_threads_config(*env, out, **{"train.max_steps": steps})
        if kind == "hook":
            code = run_subprocess(flat, kill_at=where, omp_threads=None).returncode
        else:
            code = kill_when_logged(flat, *where)
        assert code == -9, (kind, where, code)
        with threads(default):
            run_in_process(flat, **{"train.resume": "auto"})
        assert_same_run(ref, out, steps)
