"""`rollout.engine: auto` follows the measurement: grpo.rollout.engine.MEASURED_FASTEST against the winner
bench/engines.py recorded in bench/results/engines.json (a missing file fails: the table must be measured)."""

from __future__ import annotations

import json
from pathlib import Path

from grpo.rollout.engine import MEASURED_FASTEST

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "engines.json"


def test_measured_fastest_agrees_with_the_engine_benchmark():
    assert RESULTS.is_file(), f"{RESULTS} is missing: run bench/engines.py on a quiet machine and commit its result"
    results = json.loads(RESULTS.read_text())
    assert not results["quick"] and not results["partial"], "engines.json is a --quick or unfinished run"
    assert set(results["engines"]) >= {"native", "transformers", "vllm"}, "engines.json did not measure every engine"
    assert results["winner"].get("cpu"), "engines.json records no winner for cpu"
    assert MEASURED_FASTEST["cpu"] == results["winner"]["cpu"], (
        f"MEASURED_FASTEST['cpu'] is {MEASURED_FASTEST['cpu']!r} but bench/engines.py measured "
        f"{results['winner']['cpu']!r} fastest ({results['host']['cpu']}, {results['host']['date']})")
