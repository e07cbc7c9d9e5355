"""The beta sweep of Flow-GRPO, on the 2-D mixture where it runs in about a minute: a conditional MLP
flow is pre-trained until it puts every sample in the asked component (gold = 1), then Flow-GRPO optimises
the hackable proxy `rightward` (the x coordinate, whatever was asked). With beta = 0 the proxy soars, the
KL grows and the gold metric falls (the samples of left components move right); a large beta keeps the
policy near the reference and the gold metric intact. Numbers of one run are in docs/flow.md."""

import copy

import pytest
import torch

from grpo.config import build_config
from grpo.flow.evaluate import evaluate
from grpo.flow.loop import run_flow
from grpo.flow.mixture import default_mixture, sample_mixture
from grpo.flow.models import MLPFlow
from grpo.flow.pretrain import pretrain
from grpo.flow.tasks import TASKS
from grpo.state.metrics import read_metrics


def _cfg(out, beta, steps):
    return build_config(None, {"flow.task": "mixture", "flow.model": "", "flow.reward": "rightward", "flow.beta": beta,
                               "flow.prompts_per_step": 4, "rollout.num_generations": 8, "optim.lr": 3e-3,
                               "train.max_steps": steps, "train.output_dir": str(out), "train.save_final": False,
                               "log.progress_bar": False, "flow.eval_samples": 64, "health.enabled": False})


@pytest.mark.slow
def test_beta_sweep_trades_reward_for_kl_and_beta_zero_lets_gold_fall(tmp_path):
    torch.set_num_threads(1)
    points, comp = sample_mixture(default_mixture(), 4096, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    base = MLPFlow([4], dim=64, depth=3)
    pretrain(base, points, comp[:, None], 400, 256, 2e-3, 0, log_every=0)
    task, prompts = TASKS["mixture"], TASKS["mixture"].prompts(0, 0.25)[1]
    before = evaluate(base, task, prompts, _cfg(tmp_path / "e", 0.0, 1))
    assert before["gold"] >= 0.95
    runs = {}
    for beta in (0.0, 0.1, 1.0):
        model = copy.deepcopy(base)
        run_flow(_cfg(tmp_path / str(beta), beta, 30), model)
        records = read_metrics(tmp_path / str(beta) / "metrics.jsonl")
        runs[beta] = {**evaluate(model, task, prompts, _cfg(tmp_path / "e", 0.0, 1)),
                      "kl": sum(r["kl/mean"] for r in records[-5:]) / 5, "diversity": records[-1]["flow/diversity"]}
    print({"before": before, **runs})
    # the trade-off: more beta, less proxy reward and less KL
    assert runs[0.0]["rightward"] > runs[0.1]["rightward"] > runs[1.0]["rightward"] > before["rightward"]
    assert runs[0.0]["kl"] > runs[0.1]["kl"] > runs[1.0]["kl"]
    # reward hacking without the KL term: the gold metric falls; with a large beta it holds
    assert runs[0.0]["gold"] < before["gold"] - 0.3
    assert runs[1.0]["gold"] >= before["gold"] - 0.05
