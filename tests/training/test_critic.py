"""Hybrid GRPO's critic on the policy (grpo/training/critic.py): features, training, checkpoint, resume."""

import shutil

import pytest
import torch

from grpo.training.critic import prompt_features
from tests.conftest import tiny_qwen2
from tests.run_helpers import assert_same_run, make_micro_dir, make_reward, records, run_in_process, tiny_config

HYBRID = {"algorithm.preset": "hybrid_grpo", "algorithm.value_lr": 0.05}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    return make_micro_dir(root / "micro"), make_reward(root)


def test_prompt_features_ignore_left_padding():
    model = tiny_qwen2().eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]], device="cpu")
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], device="cpu")
    padded = prompt_features(model, ids, mask)
    alone = prompt_features(model, ids[:1, 2:], mask[:1, 2:])
    assert padded.shape == (2, model.config.hidden_size) and not padded.requires_grad
    torch.testing.assert_close(padded[0], alone[0], rtol=1e-4, atol=1e-5)


def test_value_head_learns_is_checkpointed_and_a_resume_is_bit_identical(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_config(*env, a, **HYBRID))
    recs = records(a)
    values = [r["critic/value_mean"] for r in recs]
    assert all(r["critic/value_loss"] >= 0 for r in recs) and len(set(values)) == len(values)
    assert (a / "checkpoint-4" / "value_head.pt").is_file()
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoint-6")
    run_in_process(tiny_config(*env, b, **HYBRID), **{"train.resume": str(b / "checkpoint-4")})
    assert_same_run(a, b, 6)
    sa = torch.load(a / "checkpoint-6" / "value_head.pt", weights_only=True)["head"]
    sb = torch.load(b / "checkpoint-6" / "value_head.pt", weights_only=True)["head"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
