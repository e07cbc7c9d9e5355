"""grpo/health/monitor.py: only new or worse findings are reported, to alerts.jsonl, the metrics and callbacks;
health.halt_on stops a run with a checkpoint; a resumed run reports what an uninterrupted one does."""

from __future__ import annotations

import json

import pytest

from grpo.config import ConfigError, build_config
from grpo.health import HealthMonitor
from tests.health.test_rules import healthy
from tests.run_helpers import make_micro_dir, make_reward, run_in_process, tiny_config


def test_only_new_or_worse_findings_are_reported(tmp_path):
    cfg = build_config({"algorithm": {"beta": 0.04}})
    share = {**{s: 0.0 for s in range(1, 41)}, **{s: 0.6 for s in range(41, 71)}, **{s: 1.0 for s in range(71, 91)}}
    records = healthy(90, **{"advantages/zero_std_frac": lambda s: share[s]}).records
    monitor = HealthMonitor(cfg, tmp_path, echo=False)
    reported = {}
    for rec in records:
        found = monitor.observe(rec)
        monitor.report(found)
        reported.update({rec["step"]: [(f.rule, f.severity) for f in found]} if found else {})
    # the W20 mean of the share first reaches 0.5 at step 57 (17 x 0.6 / 20 = 0.51; step 56: 0.48) and 0.75 at
    # step 78 ((12 x 0.6 + 8 x 1.0) / 20 = 0.76; step 77: 0.74)
    assert reported == {57: [("dead_groups", "warn")], 78: [("dead_groups", "critical")]}
    lines = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["rule"], a["severity"]) for a in lines] == [(57, "dead_groups", "warn"),
                                                                       (78, "dead_groups", "critical")]
    assert "rollout.num_generations" in lines[0]["advice"] and lines[0]["keys"]
    assert records[60]["health/dead_groups"] == 2.0 and records[60]["health/alerts"] == 0.0   # still firing, not new
    assert records[89]["health/dead_groups"] == 3.0 and records[20]["health/dead_groups"] == 0.0


def test_an_unknown_rule_in_halt_on_is_an_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="health.halt_on: unknown rule 'dead'; valid rules: non_finite"):
        HealthMonitor(build_config({"health": {"halt_on": ["dead"]}}), tmp_path)


def test_disabled_monitor_does_nothing(tmp_path):
    monitor = HealthMonitor(build_config({"health": {"enabled": False}}), tmp_path)
    rec = healthy(40, **{"advantages/zero_std_frac": 1.0}).records
    assert all(monitor.observe(r) == [] for r in rec) and "health/alerts" not in rec[-1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("health")
    return make_micro_dir(root / "micro"), make_reward(root)


#: thresholds that make the tiny run fire at once: every share of tied groups is >= 0 (critical at 1.0)
FIRING = {"health.baseline_from": 1, "health.baseline_to": 2, "health.dead_groups_warn": 0.0,
          "health.truncation_warn": 0.0}


def test_halt_on_a_critical_finding_stops_the_run_with_a_checkpoint(env, tmp_path):
    seen = []

    class Watch:
        def on_alert(self, finding):
            seen.append((finding.step, finding.rule, finding.severity))

    from grpo.api.trainer import Trainer

    flat = tiny_config(*env, tmp_path / "run", **FIRING, **{"health.dead_groups_critical": 0.0,
                                                            "health.halt_on": ["dead_groups"], "train.save_steps": 0})
    result = Trainer(config=flat, callbacks=[Watch()]).train()
    assert (result.steps, result.stopped_by) == (2, "health")
    assert result.checkpoint is not None and result.checkpoint.name == "checkpoint-2"
    assert ("2", "dead_groups", "critical") in {(str(s), r, v) for s, r, v in seen}
    alerts = [json.loads(line) for line in (tmp_path / "run" / "alerts.jsonl").read_text().splitlines()]
    assert {(a["step"], a["rule"], a["severity"]) for a in alerts} == {(s, r, v) for s, r, v in seen}
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [(s["step"], s["kind"]) for s in samples] == [(1, "best"), (1, "worst"), (2, "best"), (2, "worst")]
    assert samples[0]["total"] >= samples[1]["total"] and set(samples[0]["rewards"]) == {"digits"}


def test_a_resumed_run_reports_what_an_uninterrupted_one_does(env, tmp_path):
    flat = tiny_config(*env, tmp_path / "full", **FIRING, **{"health.dead_groups_critical": 0.6})
    run_in_process(flat)
    cut = tiny_config(*env, tmp_path / "cut", **FIRING, **{"health.dead_groups_critical": 0.6})
    run_in_process({**cut, "train.max_steps": 4})
    (tmp_path / "cut" / "alerts.jsonl").open("a").write('{"step": 5, "rule": "stale", "severity": "warn"}\n')
    run_in_process({**cut, "train.resume": "auto"})
    for name in ("alerts.jsonl", "samples.jsonl"):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "full" / name).read_text(), name
    assert (tmp_path / "full" / "alerts.jsonl").read_text().count('"dead_groups"') >= 1
