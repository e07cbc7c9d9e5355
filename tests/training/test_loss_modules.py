"""lambda-GRPO's lambda trained with the policy: an optimizer group of its own, in checkpoints, exact resume."""

import shutil

import pytest
import torch

from grpo.config import build_config
from grpo.state.resume_config import apply_optimizer_settings
from grpo.training.loss_modules import build_learnable_losses
from grpo.training.update import build_optimizer
from tests.conftest import tiny_qwen2
from tests.run_helpers import assert_same_run, make_micro_dir, make_reward, records, run_in_process, tiny_config

LAMBDA = {"algorithm.preset": "lambda_grpo", "algorithm.lambda_lr": 0.05, "rollout.max_new_tokens": 12}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("lambda")
    return make_micro_dir(root / "micro"), make_reward(root)


def test_lambda_has_its_own_group_and_keeps_its_rate_through_a_resume():
    cfg = build_config(overrides={"algorithm.token_preference": "lambda", "algorithm.lambda_lr": 0.05,
                                  "optim.lr": 1e-5, "optim.weight_decay": 0.1})
    model = tiny_qwen2()
    (lam,) = build_learnable_losses(cfg, model)
    opt, sched = build_optimizer(model, cfg.optim, 10, [lam.param_group()])
    assert [g["lr"] for g in opt.param_groups] == [1e-5, 0.05]
    assert opt.param_groups[1]["weight_decay"] == 0.0 and opt.param_groups[1]["params"] == [lam.module.lam]
    apply_optimizer_settings(opt, sched, cfg, {})
    assert [g["lr"] for g in opt.param_groups] == [1e-5, 0.05] and opt.param_groups[0]["weight_decay"] == 0.1


def test_lambda_learns_is_checkpointed_and_a_resume_is_bit_identical(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_config(*env, a, **LAMBDA))
    lams = [r["lambda_grpo/lambda"] for r in records(a)]
    assert lams[-1] != 0.0 and len(set(lams)) >= 3      # lambda moves (not while every group's lengths tie)
    saved = torch.load(a / "checkpoint-4" / "token_preference.pt", weights_only=True)
    assert float(saved["lam"]) == pytest.approx(lams[3])
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoint-6")
    run_in_process(tiny_config(*env, b, **LAMBDA), **{"train.resume": str(b / "checkpoint-4")})
    assert_same_run(a, b, 6)
    assert torch.equal(torch.load(a / "checkpoint-6" / "token_preference.pt", weights_only=True)["lam"],
                       torch.load(b / "checkpoint-6" / "token_preference.pt", weights_only=True)["lam"])
