"""Data-parallel GRPO (grpo/distributed.py): 2 CPU processes with gloo, under torchrun, for DDP and FSDP2.

* one update on each rank's half of a global batch equals the single-process update on the whole batch
  (parameters within 1e-6; loss and gradient norm agree), for a per-completion and a per-token normaliser;
* after a 2-step training run both ranks hold identical parameters, equal to the checkpoint rank 0 wrote;
* the 2-rank checkpoint resumes in 1 process (optimizer state included) and continues the global prompt order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.distributed import ShardedStream, check_config
from tests.run_helpers import ROOT, final_weights, make_micro_dir, make_reward, records, run_in_process, tiny_config


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    base = tmp_path_factory.mktemp("dist")
    return make_micro_dir(base / "model"), make_reward(base)


def torchrun(mode: str, work: Path, model_dir: Path, reward: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(ROOT / "tests" / "dist_worker.py"), mode, str(work), str(model_dir), reward]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_ranks_equal_one_process(mode, assets, tmp_path):
    model_dir, reward = assets
    proc = torchrun(mode, tmp_path, model_dir, reward)
    assert proc.returncode == 0, proc.stderr[-4000:]

    for r in (0, 1):                                        # 1. the update equals the single-process one
        for agg, res in json.loads((tmp_path / f"unit-{r}.json").read_text()).items():
            assert res["moved"] > 1e-5, agg                 # the step did change the weights
            assert res["max_diff"] < 1e-6, (agg, res)
            assert res["loss"][0] == pytest.approx(res["loss"][1], rel=1e-5, abs=1e-7), (agg, res)
            assert res["grad_norm"][0] == pytest.approx(res["grad_norm"][1], rel=1e-5), (agg, res)

    run = tmp_path / "run"                                  # 2. ranks agree; rank 0 wrote the checkpoints
    p0, p1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)
    saved = final_weights(run / "checkpoint-2")
    assert saved and all(torch.equal(saved[k], p0[k]) for k in saved)
    assert [r["step"] for r in records(run)] == [1, 2]
    assert records(run)[0]["completion/length_mean"] > 0

    # 3. resume the 2-rank checkpoint-1 in one process
    out = tmp_path / "resumed"
    flat = tiny_config(model_dir, reward, out, **{"train.max_steps": 2, "train.save_steps": 1,
                                                  "train.parallel": mode})
    result = run_in_process(flat, **{"train.resume": str(run / "checkpoint-1")})
    assert result.steps == 2 and (out / "checkpoint-2").is_dir()
    assert [r["step"] for r in records(out)] == [2]
    rng_2rank = torch.load(run / "checkpoint-2" / "rng_state.pt", weights_only=True)
    rng_1proc = torch.load(out / "checkpoint-2" / "rng_state.pt", weights_only=True)
    assert torch.equal(rng_2rank["stream"]["order"], rng_1proc["stream"]["order"])   # same global prompt order
    assert rng_2rank["stream"]["epoch"] == rng_1proc["stream"]["epoch"]
    optim_2rank = torch.load(run / "checkpoint-1" / "optimizer.pt", weights_only=True)["optimizer"]
    assert sorted(optim_2rank["state"]) == list(range(len(optim_2rank["param_groups"][0]["params"])))


def test_sharded_stream_slices_the_global_order():
    from grpo.data import PromptStream

    rows = [{"prompt": str(i)} for i in range(10)]
    whole = PromptStream(rows, 3)
    shards = [ShardedStream(PromptStream(rows, 3), r, 2) for r in range(2)]
    for _ in range(4):
        glob = whole.next(4)
        assert shards[0].next(2) + shards[1].next(2) == glob
    assert torch.equal(shards[1].state_dict()["order"], whole.state_dict()["order"])


def test_settings_that_must_divide_or_are_single_process():
    cfg = build_config(overrides={"train.prompts_per_step": 3})
    with pytest.raises(ConfigError, match="divisible"):
        check_config(cfg, 2)
    check_config(build_config(overrides={"train.prompts_per_step": 4}), 2)
    with pytest.raises(ConfigError, match="single-process"):
        check_config(build_config(overrides={"train.prompts_per_step": 4, "algorithm.scale_rewards": "batch"}), 2)
    with pytest.raises(ConfigError, match="train.parallel"):
        build_config(overrides={"train.parallel": "zero3"})
