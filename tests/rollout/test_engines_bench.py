"""`rollout.engine: auto` follows the measurement: grpo.rollout.engine.MEASURED_FASTEST against the per-model
winners bench/engines.py recorded in bench/results/engines.json (a missing file fails: the table must be measured)."""

from __future__ import annotations

import json
from pathlib import Path

from grpo.rollout.engine import measured_fastest

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "engines.json"


def test_measured_fastest_agrees_with_the_engine_benchmark():
    assert RESULTS.is_file(), f"{RESULTS} is missing: run bench/engines.py on a quiet machine and commit its result"
    results = json.loads(RESULTS.read_text())
    assert not results["quick"] and not results["partial"], "engines.json is a --quick or unfinished run"
    assert set(results["engines"]) >= {"native", "transformers", "vllm"}, "engines.json did not measure every engine"
    by_model = results["winner_by_model"]["cpu"]
    assert len(by_model) >= 2, "engines.json records per-model winners for fewer than two model sizes"
    for model, w in by_model.items():
        assert measured_fastest("cpu", w["parameters"]) == w["winner"], (
            f"MEASURED_FASTEST says {measured_fastest('cpu', w['parameters'])!r} for {model} "
            f"({w['parameters']} parameters) but bench/engines.py measured {w['winner']!r} fastest "
            f"({results['host']['cpu']}, {results['host']['date']})")
