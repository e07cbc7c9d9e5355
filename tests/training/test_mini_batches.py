"""algorithm.mini_batches: each pass over the step's groups is split into equal parts, one optimizer update each,
against the old policy's stored log-probs; resumes stay exact."""

import shutil

import pytest
import torch

import grpo.training.loop as loop
from grpo.config import ConfigError, build_config
from grpo.types import TrainBatch
from tests.run_helpers import assert_same_run, make_micro_dir, make_reward, records, run_in_process, tiny_config


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("mini_batches")
    return make_micro_dir(d / "model"), make_reward(d)


def test_mini_batches_are_consecutive_whole_row_ranges():
    n = 8
    batch = TrainBatch(torch.arange(n)[:, None], torch.ones(n, 1), torch.ones(n, 1), torch.arange(n).float(),
                       None, None, None, None, {})
    parts = loop.mini_batches(batch, 4)
    assert [p.advantages.tolist() for p in parts] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert loop.mini_batches(batch, 1) == [batch]


def test_each_pass_makes_one_update_per_mini_batch_against_stored_old_log_probs(env, tmp_path, monkeypatch):
    seen = []
    real = loop.update

    def counting(state, batch, cfg, step, world, plan):
        seen.append((step, batch.input_ids.shape[0], batch.old_logprobs is not None))
        return real(state, batch, cfg, step, world, plan)

    monkeypatch.setattr(loop, "update", counting)
    run_in_process(tiny_config(*env, tmp_path / "a"), **{"algorithm.mini_batches": 2, "algorithm.num_iterations": 2,
                                                          "train.max_steps": 2, "optim.lr": 0.05})
    # 2 prompts x G 4 = 8 rows per step: 2 passes x 2 mini-batches of 4 rows, each with pi_old's log-probs
    assert seen == [(s, 4, True) for s in (1, 2) for _ in range(4)]
    rows = records(tmp_path / "a")
    assert any(r["policy/clip_frac"] > 0 for r in rows)       # later updates are off-policy: ratios leave 1


def test_resume_with_mini_batches_is_exact(env, tmp_path):
    over = {"algorithm.mini_batches": 2, "train.max_steps": 4, "train.save_steps": 2}
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_config(*env, a), **over)
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoint-4")
    run_in_process(tiny_config(*env, b), **{**over, "train.resume": str(b / "checkpoint-2")})
    assert_same_run(a, b, 4)


def test_prompts_must_split_into_the_mini_batches():
    with pytest.raises(ConfigError, match=r"train.prompts_per_step \(3\) must split into algorithm.mini_batches \(2\)"):
        build_config(overrides={"train.prompts_per_step": 3, "algorithm.mini_batches": 2})
    assert build_config(overrides={"algorithm.mini_batches": 2, "algorithm.num_iterations": 3}).algorithm.updates_per_step == 6
