"""Deliberately broken runs of the embedded task (slow): each raises its named alert within its first 60 steps,
with advice that names a config key. The demo's settings with 8 prompts per step; measured alerts in
docs/health.md."""

from __future__ import annotations

import json

import pytest

from grpo.api.trainer import Trainer
from grpo.cli.demo import DEMO_CONFIG


def length_only(completions, **kwargs):
    """Pays for length and nothing else."""
    return [len(c) / 40 for c in completions]


def constant(completions, **kwargs):
    """The same score for every completion: no group ever has a reward spread."""
    return [1.0 for _ in completions]


BROKEN = {   # name: (config overrides, reward functions, alerts that must appear {rule (a|b: either): lowest severity})
    # 300x the demo's lr: at 3e-3 (100x) the entropy's path was chaotic enough that float rounding decided
    # whether it collapsed within 60 steps; at 1e-2 it does under either LM-head path (docs/health.md)
    # On an AVX-512 host (other GEMM kernels, other rounding) the same run's entropy blew up instead (0.061 -> 0.62
    # by step 32): which way it leaves its baseline is the rounding's choice, that it leaves it is not
    "lr_too_high": ({"optim.lr": 1e-2}, None, {"kl_blowup": "critical", "entropy_collapse|entropy_blowup": "warn"}),
    "length_only_reward": ({}, [length_only], {"length_inflation": "warn"}),
    "max_new_tokens_too_small": ({"rollout.max_new_tokens": 6}, None, {"truncation": "critical"}),
    "constant_reward": ({}, [constant], {"dead_groups": "critical", "no_update": "critical"}),
}
LEVEL = {"info": 1, "warn": 2, "critical": 3}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_run_raises_its_alert_within_60_steps(name, tmp_path):
    overrides, rewards, expected = BROKEN[name]
    flat = {f"{s}.{k}": v for s, d in DEMO_CONFIG.items() for k, v in d.items()}
    flat.update({"train.max_steps": 60, "train.prompts_per_step": 8, "train.output_dir": str(tmp_path / name),
                 "log.progress_bar": False, "train.save_final": False, **overrides})
    seen = []
    Trainer(reward_funcs=rewards, config=flat, callbacks=[type("Watch", (), {"on_alert": staticmethod(seen.append)})()]).train()
    alerts = [json.loads(line) for line in (tmp_path / name / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["rule"]) for a in alerts] == [(f.step, f.rule) for f in seen]      # file == callbacks
    worst = {}
    for a in alerts:
        worst[a["rule"]] = max(worst.get(a["rule"], 0), LEVEL[a["severity"]])
        assert a["step"] <= 60 and a["keys"] and any(k in a["advice"] for k in a["keys"]), a
    for rules, severity in expected.items():
        assert max(worst.get(rule, 0) for rule in rules.split("|")) >= LEVEL[severity], (rules, alerts)
    metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    for a in alerts:                                   # the metrics carry each finding's level at its step
        assert metrics[a["step"] - 1][f"health/{a['rule']}"] == LEVEL[a["severity"]]
