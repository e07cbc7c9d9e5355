"""grpo/training/rejection.py and `grpo sample`: selection rules, streaming, kill and resume."""

import json
import os
import subprocess
import sys

import pytest

from grpo.training.rejection import Selection, resume_point, select
from tests.run_helpers import ROOT, make_micro_dir


def s(i, first, reward=None, completion=None, length=5, language=1.0, repetition=0.0):
    return {"sample": i, "first": first, "reward": first if reward is None else reward, "length": length,
            "completion": completion or f"c{i}", "language": language, "repetition": repetition}


def test_keep_correct_best_all_dedupe_cap_and_readability():
    samples = [s(0, 1.0), s(1, 0.0, reward=2.0), s(2, 1.0, completion="c0"), s(3, float("nan")), s(4, 1.0, length=50)]
    picked = lambda **kw: [x["sample"] for x in select(samples, Selection(**kw))]  # noqa: E731
    assert picked(keep="correct") == [0, 2, 4]                              # first reward >= 0.5; NaN is not
    assert picked(keep="best") == [1]                                       # the highest total
    assert picked(keep="all") == [0, 1, 2, 3, 4]
    assert picked(keep="correct", dedupe=True) == [0, 4]                    # "c0" twice: one kept
    assert picked(keep="correct", max_per_prompt=1) == [0]
    assert picked(keep="correct", max_length=10) == [0, 2]                  # R1 readability: length
    assert [x["sample"] for x in select([s(0, 1.0, language=0.4), s(1, 1.0, repetition=0.9), s(2, 1.0)],
                                        Selection(min_language=0.5, max_repetition=0.5))] == [2]
    assert picked(keep="best", min_reward=3.0) == []
    with pytest.raises(ValueError, match="--keep must be one of correct | best | all"):
        select(samples, Selection(keep="some"))


def test_resume_point_drops_a_torn_line_and_the_last_prompt(tmp_path):
    out = tmp_path / "s.jsonl"
    assert resume_point(out) == 0
    rows = [{"prompt_index": p, "sample": k} for p in (0, 1, 2) for k in (0, 1)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"prompt_index": 2, "sam')
    assert resume_point(out) == 2
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows[:4]


def sample_cmd(model, out, *extra):
    return ["sample", "--model", str(model), "--problems", "8", "--num-samples", "3", "--keep", "all",
            "--batch-size", "2", "--max-new-tokens", "6", "--out", str(out), *extra]


def test_sigkill_midway_keeps_finished_rows_and_resume_writes_no_duplicates(tmp_path):
    model = make_micro_dir(tmp_path / "micro")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "s.jsonl"
    killed = subprocess.run([sys.executable, "-m", "tests.kill_hook", "sample:4", "--", *sample_cmd(model, out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    before = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({r["prompt_index"] for r in before}) == [0, 1, 2, 3]        # two batches written, then the kill
    from grpo.cli.main import main

    assert main(sample_cmd(model, out)) == 2                                  # no silent overwrite
    assert main(sample_cmd(model, out, "--resume")) == 0
    after = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(r["prompt_index"], r["sample"]) for r in after]
    assert sorted(keys) == [(p, k) for p in range(8) for k in range(3)]       # every row once
    assert after[:9] == before[:9]                                            # prompts 0-2 untouched
    assert {"prompt", "completion", "rewards", "reward", "answer"} <= set(after[0])
