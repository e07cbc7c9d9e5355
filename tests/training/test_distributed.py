"""Data-parallel GRPO (grpo/training/distributed.py): 2 CPU processes with gloo, under torchrun, for DDP and FSDP2.

* one update on each rank's half of a global batch equals the single-process update on the whole batch
  (parameters within 1e-6; loss and gradient norm agree), for a per-completion and a per-token normaliser;
* after a 2-step training run both ranks hold identical parameters, equal to the checkpoint rank 0 wrote;
* the 2-rank checkpoint resumes in 1 process (optimizer state included), continues the global prompt order and
  samples the completions the 2-rank run sampled at that step;
* world-size invariance: a 3-step run (plain SGD) on 2 ranks samples exactly the completions of 1 process, with
  the same rewards, and ends with parameters equal to the 1-process run's within 1e-6 relative.
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
from grpo.training.distributed import ShardedStream, check_config
from tests.dist_worker import SAME_AS_ONE, plain_sgd, recording_draws
from tests.run_helpers import ROOT, final_weights, make_micro_dir, make_reward, records, run_in_process, tiny_config


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    base = tmp_path_factory.mktemp("dist")
    return make_micro_dir(base / "model"), make_reward(base)


@pytest.fixture(scope="module")
def one_process(assets, tmp_path_factory):
    """The invariance run of tests/dist_worker.py in one process: {global prompt index: draws}, final parameters."""
    import grpo.training.experience
    import grpo.training.loop
    import grpo.training.update

    log: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grpo.training.experience, "draw_groups", recording_draws(grpo.training.experience.draw_groups, log))
        mp.setattr(grpo.training.loop, "build_optimizer", plain_sgd)
        mp.setattr(grpo.training.update, "build_optimizer", plain_sgd)
        result = run_in_process(tiny_config(*assets, tmp_path_factory.mktemp("one") / "same", **SAME_AS_ONE))
    return {str(p): d for p, d in log.items()}, {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def torchrun(mode: str, work: Path, model_dir: Path, reward: str, *part: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(ROOT / "tests" / "dist_worker.py"), mode, str(work), str(model_dir), reward, *part]
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
    one, two = records(out)[0], records(run)[1]             # step 2 in 1 process samples what 2 ranks sampled
    for key in ("reward/total/mean", "reward/total/std", "completion/length_mean", "completion/length_max"):
        assert one[key] == pytest.approx(two[key], rel=1e-6), key
    rng_2rank = torch.load(run / "checkpoint-2" / "rng_state.pt", weights_only=True)
    rng_1proc = torch.load(out / "checkpoint-2" / "rng_state.pt", weights_only=True)
    assert torch.equal(rng_2rank["stream"]["order"], rng_1proc["stream"]["order"])   # same global prompt order
    assert rng_2rank["stream"]["epoch"] == rng_1proc["stream"]["epoch"]
    optim_2rank = torch.load(run / "checkpoint-1" / "optimizer.pt", weights_only=True)["optimizer"]
    assert sorted(optim_2rank["state"]) == list(range(len(optim_2rank["param_groups"][0]["params"])))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_ranks_sample_what_one_process_samples(mode, assets, one_process, tmp_path):
    """World-size invariance: rank 0 samples prompts 0, 1 of every step, rank 1 prompts 2, 3 (global indices);
    together they draw exactly the completions one process draws for prompts 0..3."""
    model_dir, reward = assets
    proc = torchrun(mode, tmp_path, model_dir, reward, "same")
    assert proc.returncode == 0, proc.stderr[-4000:]
    draws = [json.loads((tmp_path / f"draws-{r}.json").read_text()) for r in (0, 1)]
    single, w_single = one_process
    assert sorted(map(int, single)) == list(range(12))                        # 3 steps x 4 prompts
    assert [sorted(map(int, d)) for d in draws] == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 11]]
    merged = {**draws[0], **draws[1]}
    assert {p: d["ids"] for p, d in merged.items()} == {p: d["ids"] for p, d in single.items()}   # same completions
    assert {p: d["rewards"] for p, d in merged.items()} == {p: d["rewards"] for p, d in single.items()}
    assert len({tuple(map(tuple, d["ids"])) for d in single.values()}) > 1     # not one repeated sample
    w0 = final_weights(model_dir)
    update = max(float((w_single[k] - w0[k]).abs().max()) for k in w0)        # how far 3 SGD steps moved: ~2e-3
    for r in (0, 1):
        w2 = torch.load(tmp_path / f"same-rank{r}.pt")
        for k in w0:                                        # float reduction tolerance: 1e-6 of each tensor's scale
            assert float((w2[k] - w_single[k]).abs().max()) <= 1e-6 * float(w_single[k].abs().max()), k
        diff = max(float((w2[k] - w_single[k]).abs().max()) for k in w0)    # ~4e-9: an ulp, not a different update
        assert update > 1e-4 and diff <= 1e-4 * update, (diff, update)


def test_sharded_stream_slices_the_global_order():
    from grpo.data.prompts import PromptStream

    rows = [{"prompt": str(i)} for i in range(10)]
    whole = PromptStream(rows, 3)
    shards = [ShardedStream(PromptStream(rows, 3), r, 2) for r in range(2)]
    for _ in range(4):
        glob = whole.next(4)
        assert shards[0].next(2) + shards[1].next(2) == glob
    assert torch.equal(shards[1].state_dict()["order"], whole.state_dict()["order"])


def test_global_prompt_indices_count_draws_across_epochs_and_ranks():
    from grpo.data.prompts import PromptStream

    rows = [{"prompt": str(i)} for i in range(10)]
    whole = PromptStream(rows, 3)
    shards = [ShardedStream(PromptStream(rows, 3), r, 2) for r in range(2)]
    assert whole.position == 0
    for step in range(4):                                   # the 4th step crosses into epoch 2
        glob, index = whole.next_indexed(4)
        assert index == list(range(4 * step, 4 * step + 4)) and whole.position == 4 * step + 4
        mine = [s.next_indexed(2) for s in shards]
        assert mine[0][0] + mine[1][0] == glob and mine[0][1] + mine[1][1] == index
    restored = PromptStream(rows, 3)
    restored.load_state_dict(whole.state_dict())            # a checkpointed stream knows its position
    assert restored.position == 16 and restored.next_indexed(1)[1] == [16]


def test_settings_that_must_divide_or_are_single_process():
    cfg = build_config(overrides={"train.prompts_per_step": 3})
    with pytest.raises(ConfigError, match="divisible"):
        check_config(cfg, 2)
    check_config(build_config(overrides={"train.prompts_per_step": 4}), 2)
    with pytest.raises(ConfigError, match="single-process"):
        check_config(build_config(overrides={"train.prompts_per_step": 4, "algorithm.scale_rewards": "batch"}), 2)
    with pytest.raises(ConfigError, match="train.parallel"):
        build_config(overrides={"train.parallel": "zero3"})
