"""Entropy coefficient control (grpo/algorithms/entropy_control.py): Skywork-OR1's adaptive rule, hand values."""

import math

import pytest

from grpo.algorithms.entropy_control import ENTROPY_CONTROLS, EntropyControlParams

P = EntropyControlParams(target=0.2, delta=0.005, coef_min=0.0, coef_max=0.012)


def test_adaptive_moves_towards_the_target_within_bounds():
    applied, step = ENTROPY_CONTROLS["adaptive"]
    assert step(0.004, 0.1, P) == pytest.approx(0.009)      # entropy at or below target: up by delta
    assert step(0.004, 0.2, P) == pytest.approx(0.009)      # "at" counts as below
    assert step(0.009, 0.1, P) == pytest.approx(0.012)      # capped at coef_max
    assert step(0.004, 0.5, P) == pytest.approx(0.0)        # above: down, floored at coef_min
    assert applied(0.009, math.inf, P) == 0.0               # no measurement yet: no bonus
    assert applied(0.009, 0.3, P) == 0.0 and applied(0.009, 0.15, P) == 0.009


def test_fixed_keeps_the_coefficient():
    applied, step = ENTROPY_CONTROLS["fixed"]
    assert applied(0.01, math.inf, P) == 0.01 and step(0.01, 0.0, P) == 0.01
