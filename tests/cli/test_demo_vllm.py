"""The demos through vLLM's CPU build (`rollout.engine vllm`, colocated): run by `make test-vllm` in the vLLM venv."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vLLM venv (make test-vllm) runs these")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
VLLM = {"log.progress_bar": False, "rollout.engine": "vllm", "rollout.vllm.kv_cache_gb": 0.5}


def test_demo_learns_with_the_vllm_engine(tmp_path):
    """grpo demo --rollout.engine vllm: the full demo (150 steps) raises greedy held-out accuracy by >= 15 points
    with every rollout sampled by vLLM and its weights synced after every update (docs/results.md)."""
    from grpo.cli.demo import run_demo

    summary = run_demo(tmp_path / "demo", overrides=VLLM)
    gain = summary["after"]["accuracy"] - summary["before"]["accuracy"]
    assert gain >= 0.15, summary


def test_calculator_demo_runs_its_episodes_through_vllm(tmp_path):
    """grpo demo --task calculator --rollout.engine vllm, shortened as in test_demo.py: multi-turn episodes turn by
    turn through vLLM (grpo/rollout/engines/turns.py) teach the policy to use the tool."""
    from grpo.cli.demo_calculator import run_calculator_demo

    s = run_calculator_demo(tmp_path / "calc", steps=40, eval_problems=64, overrides=VLLM)
    assert s["after"]["exact_match"] >= s["before"]["exact_match"] + 0.15, s
    assert s["after"]["tool_use"] > s["before"]["tool_use"], s
