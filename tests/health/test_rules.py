"""grpo/health/rules.py: every rule fires on a synthetic history made to show its failure, with the expected
severity and advice naming a config key, and stays silent on this project's healthy demo history."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from grpo.config import build_config
from grpo.health import RULES, History, evaluate
from grpo.health.history import change, mad, spike_flags

DEMO = Path(__file__).parent / "fixtures" / "demo_metrics.jsonl"   # `grpo demo` (150 steps, beta 0.04), healthy
CFG = build_config({"algorithm": {"beta": 0.04}})


def healthy(n: int = 60, **columns) -> History:
    """n steps of a run that learns: accuracy 0.3 -> 0.7, format at 1 from the start, steady everything else.
    `columns` replace a metric by a function of the step (1-based) or a constant."""
    rng = np.random.default_rng(0)
    base = {
        "reward/total/mean": lambda s: 1.3 + 0.4 * s / n, "reward/accuracy/mean": lambda s: 0.3 + 0.4 * s / n,
        "reward/accuracy/max": 1.0, "reward/accuracy/none_frac": 0.0, "reward/format/mean": 1.0,
        "reward/format/max": 1.0, "reward/format/none_frac": 0.0, "advantages/zero_std_frac": 0.1,
        "optim/grad_norm": lambda s: 1.0 + 0.05 * math.sin(s), "policy/entropy": 0.5, "kl/mean": 0.01,
        "loss/total": 0.01, "completion/truncated_frac": 0.0, "completion/length_mean": lambda s: 20 + 0.01 * s,
        "completion/length_reward_corr": 0.2, "completion/repetition_frac": 0.0, "policy/clip_frac": 0.0,
        "policy/clip_low_frac": 0.0, "policy/clip_high_frac": 0.0,
    }
    base.update(columns)
    h = History()
    for s in range(1, n + 1):
        rec = {"step": s}
        for k, v in base.items():
            rec[k] = float(v(s)) if callable(v) else v
        if "optim/grad_norm" not in columns:
            rec["optim/grad_norm"] += float(rng.normal(0, 0.01))
        h.append(rec)
    return h


def fired(h: History, cfg=CFG) -> dict[str, str]:
    return {f.rule: f.severity for f in evaluate(h, cfg)}


def test_the_synthetic_healthy_run_is_silent():
    assert fired(healthy()) == {}


def test_demo_history_stays_silent_at_every_step():
    """The calibration run: `grpo demo` (accuracy 26.6% -> 94.9%) raises nothing at any of its 150 steps."""
    records = [json.loads(line) for line in DEMO.read_text().splitlines()]
    assert len(records) == 150
    h = History()
    for rec in records:
        h.append(rec)
        assert evaluate(h, CFG) == [], rec["step"]


@pytest.mark.parametrize("rule, columns, severity", [
    ("dead_groups", {"advantages/zero_std_frac": 0.6}, "warn"),
    ("dead_groups", {"advantages/zero_std_frac": 0.8}, "critical"),
    ("no_update", {"optim/grad_norm": lambda s: 0.0 if s % 2 else 1.0}, "warn"),
    ("no_update", {"optim/grad_norm": 0.0}, "critical"),
    ("entropy_collapse", {"policy/entropy": lambda s: 0.5 if s <= 40 else 0.08,
                          "reward/accuracy/mean": 0.5}, "warn"),
    ("entropy_collapse", {"policy/entropy": lambda s: 0.5 if s <= 40 else 0.02}, "critical"),
    # gone before the baseline window (B ~ 0, a 300x learning rate on an AMX host): against steps 1..9 instead
    ("entropy_collapse", {"policy/entropy": lambda s: 0.25 if s < 10 else 7e-5}, "critical"),
    ("entropy_collapse", {"policy/entropy": lambda s: 0.25 if s < 10 else 0.0}, "critical"),
    ("entropy_blowup", {"policy/entropy": lambda s: 0.5 if s <= 40 else 1.0 + 0.1 * (s - 40)}, "warn"),
    ("entropy_blowup", {"policy/entropy": lambda s: 0.5 if s <= 40 else 1.0 + 0.1 * (s - 40),
                        "reward/accuracy/mean": lambda s: 0.5 if s <= 40 else 0.5 - 0.02 * (s - 40)}, "critical"),
    ("kl_blowup", {"kl/mean": lambda s: 0.01 if s <= 45 else 0.3 + 0.05 * (s - 45)}, "warn"),
    ("kl_blowup", {"kl/mean": lambda s: 0.01 if s < 60 else 0.5}, "warn"),           # one spike
    ("kl_blowup", {"kl/mean": lambda s: 0.01 if s <= 45 else 3.0}, "critical"),
    ("truncation", {"completion/truncated_frac": 0.2}, "warn"),
    ("truncation", {"completion/truncated_frac": 0.7}, "critical"),
    ("length_inflation", {"completion/length_mean": lambda s: 20 if s <= 30 else 20 + (s - 30),
                          "reward/accuracy/mean": 0.5}, "warn"),
    ("length_inflation", {"completion/length_reward_corr": 0.95}, "warn"),
    ("length_collapse", {"completion/length_mean": lambda s: 20 if s <= 40 else 4}, "warn"),
    ("clip_saturation", {"policy/clip_frac": 0.15, "policy/clip_high_frac": 0.08, "policy/clip_low_frac": 0.07}, "warn"),
    ("clip_saturation", {"policy/clip_frac": 0.4, "policy/clip_high_frac": 0.2, "policy/clip_low_frac": 0.2}, "critical"),
    ("clip_saturation", {"policy/clip_frac": 0.08, "policy/clip_high_frac": 0.01, "policy/clip_low_frac": 0.07}, "info"),
    ("grad_spike", {"optim/grad_norm": lambda s: 1.0 if s < 60 else 9.0}, "warn"),
    ("grad_spike", {"optim/grad_norm": lambda s: 9.0 if s in (40, 50, 60) else 1.0}, "critical"),
    ("format_gaming", {"reward/format/mean": lambda s: 0.2 if s <= 30 else 1.0, "reward/accuracy/mean": 0.3}, "warn"),
    ("format_gaming", {"reward/format/mean": lambda s: 0.2 if s <= 30 else 1.0,
                       "reward/accuracy/mean": lambda s: 0.4 if s <= 30 else 0.4 - 0.01 * (s - 30)}, "critical"),
    ("repetition", {"completion/repetition_frac": lambda s: 0.0 if s <= 40 else 0.5}, "warn"),
    ("repetition", {"completion/repetition_frac": lambda s: 0.0 if s <= 40 else 0.5,
                    "completion/truncated_frac": lambda s: 0.0 if s <= 40 else 0.3}, "critical"),
])
def test_rule_fires_on_its_failure(rule, columns, severity):
    found = {f.rule: f for f in evaluate(healthy(**columns), CFG)}
    assert rule in found, sorted(found)
    f = found[rule]
    assert f.severity == severity
    assert f.step == 60 and f.keys and all("." in k for k in f.keys)          # advice names config keys
    assert any(k in f.advice for k in f.keys)


def test_entropy_collapse_keeps_its_window_baseline_when_the_entropy_was_there_in_it():
    # steps 1..9 at 0.5, the baseline window at 0.06 (12 % of that, above the critical 10 %), then steady: silent
    assert "entropy_collapse" not in fired(healthy(**{"policy/entropy": lambda s: 0.5 if s < 10 else 0.06}))


def test_clip_saturation_on_a_flow_run_names_the_flow_keys():
    h = healthy(**{"policy/clip_frac": 0.2, "flow/ratio_max_dev": 0.01})
    f = {f.rule: f for f in evaluate(h, CFG)}["clip_saturation"]
    assert f.severity == "warn" and f.keys == ("optim.lr", "flow.updates_per_step", "flow.epsilon")
    assert "(image, step) ratios" in f.message and "num_iterations" not in f.advice


def test_length_inflation_with_rising_truncation_is_critical():
    h = healthy(**{"completion/length_reward_corr": 0.99,
                   "completion/truncated_frac": lambda s: 0.0 if s <= 40 else min(1.0, 0.05 * (s - 40))})
    assert fired(h)["length_inflation"] == "critical"


def test_non_finite_fires_at_any_step_and_only_it_before_the_baseline():
    h = healthy(5, **{"loss/total": float("nan"), "advantages/zero_std_frac": 1.0})
    assert fired(h) == {"non_finite": "critical"}          # dead groups too, but step 5 < health.baseline_to
    h = healthy(60, **{"optim/grad_norm": lambda s: float("inf") if s == 60 else 1.0})
    assert fired(h)["non_finite"] == "critical"


def test_non_finite_ignores_what_is_undefined_by_design():
    """kl/mean is NaN with beta = 0; a total reward is NaN when no function applied to any sample."""
    h = healthy(10, **{"kl/mean": float("nan")})
    assert fired(h, build_config({"algorithm": {"beta": 0.0}})) == {}
    assert fired(h, CFG) == {"non_finite": "critical"}
    h = healthy(10, **{"reward/total/mean": float("nan"), "reward/accuracy/none_frac": 1.0,
                       "reward/format/none_frac": 1.0})
    assert fired(h) == {}


def test_proxy_divergence_compares_training_and_held_out_gains():
    def run(eval_at):
        return healthy(60, **{"reward/accuracy/mean": lambda s: 0.2 + 0.01 * s,
                              "eval/reward/accuracy": lambda s: eval_at(s) if s % 10 == 0 else float("nan")})
    assert "proxy_divergence" not in fired(run(lambda s: 0.2 + 0.01 * s))      # eval follows the reward
    # the training reward's W10 mean gains 0.755 - 0.255 = 0.5 between the evaluations at steps 10 and 60
    assert fired(run(lambda s: 0.3 + 0.005 * (s - 10)))["proxy_divergence"] == "warn"     # eval +0.25: gap 0.25
    assert fired(run(lambda s: 0.3))["proxy_divergence"] == "critical"                    # eval flat: gap 0.5
    assert fired(run(lambda s: 0.5 - 0.005 * s))["proxy_divergence"] == "critical"


def test_every_threshold_is_a_config_key():
    cfg = build_config({"health": {"dead_groups_warn": 0.05, "dead_groups_critical": 0.9}})
    assert fired(healthy(), cfg) == {"dead_groups": "warn"}
    assert set(RULES) == {"non_finite", "dead_groups", "no_update", "entropy_collapse", "entropy_blowup", "kl_blowup",
                          "truncation", "length_inflation", "length_collapse", "clip_saturation", "grad_spike",
                          "format_gaming", "repetition", "proxy_divergence"}


def test_statistics_against_hand_values():
    assert change(np.array([1.0, 2.0, 3.0, 4.0])) == pytest.approx(3.0)        # slope 1 over 3 intervals
    assert change(np.array([1.0, np.nan, 3.0])) == pytest.approx(2.0)
    assert mad(np.array([1.0, 2.0, 3.0, 4.0, 100.0])) == 1.0                   # |x - 3| = 2,1,0,1,97 -> median 1
    x = np.array([1.0] * 20 + [5.0])
    assert spike_flags(x, 8.0, 3.0).tolist() == [False] * 20 + [True]
    assert not spike_flags(np.array([1.0] * 5 + [5.0]), 8.0, 3.0).any()       # fewer than 10 values before it


def test_spike_flags_of_the_tail_equal_the_full_computation():
    rng = np.random.default_rng(1)
    x = np.abs(rng.normal(1.0, 0.1, 200))
    x[[120, 150, 199]] = 9.0
    full, tail = spike_flags(x, 8.0, 3.0), spike_flags(x, 8.0, 3.0, tail=50)
    assert tail[-50:].tolist() == full[-50:].tolist() and not tail[:-50].any()
    assert np.flatnonzero(full).tolist() == [120, 150, 199]
