"""The adaptive entropy coefficient in training: the logged sequence follows the rule, the bonus enters the
loss only once it applies, and a resumed run continues the same sequence (entropy_control.json)."""

import shutil

import pytest

from tests.run_helpers import assert_same_run, make_micro_dir, make_reward, records, run_in_process, tiny_config


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("entropy_control")
    return make_micro_dir(d / "model"), make_reward(d)


ADAPTIVE = {"algorithm.entropy_control": "adaptive", "algorithm.entropy_coef": 0.01, "algorithm.entropy_target": 100.0,
            "algorithm.entropy_coef_delta": 0.02, "algorithm.entropy_coef_max": 0.05, "train.max_steps": 4}


def test_adaptive_coefficient_sequence_and_its_effect(env, tmp_path):
    run_in_process(tiny_config(*env, tmp_path / "a"), **ADAPTIVE)
    rows = records(tmp_path / "a")
    # entropy (a few nats) is always below the target 100: up by 0.02 per step from 0.01, capped at 0.05
    assert [r["entropy/coef"] for r in rows] == pytest.approx([0.03, 0.05, 0.05, 0.05])
    assert [r["entropy/coef_applied"] for r in rows] == pytest.approx([0.0, 0.03, 0.05, 0.05])   # step 1: none yet
    run_in_process(tiny_config(*env, tmp_path / "b"), **{**ADAPTIVE, "algorithm.entropy_target": 0.0})
    down = records(tmp_path / "b")                            # always above a target of 0: down to 0, never applied
    assert [r["entropy/coef"] for r in down] == pytest.approx([0.0] * 4)
    assert [r["entropy/coef_applied"] for r in down] == [0.0] * 4
    assert rows[0]["loss/total"] == down[0]["loss/total"]    # same first step (no bonus in either)
    assert rows[1]["loss/total"] != down[1]["loss/total"]    # the bonus of 0.03 x H enters step 2's loss


def test_a_resumed_run_continues_the_coefficients(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_config(*env, a), **ADAPTIVE)
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoint-4")
    run_in_process(tiny_config(*env, b), **{**ADAPTIVE, "train.resume": str(b / "checkpoint-2")})
    assert (b / "checkpoint-2" / "entropy_control.json").is_file()
    assert_same_run(a, b, 4)
