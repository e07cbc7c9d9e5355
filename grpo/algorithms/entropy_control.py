"""How the entropy bonus coefficient evolves (``algorithm.entropy_control``): pure functions of floats.

The loss carries ``-c_k * H`` (grpo.algorithms.loss). Every entry of ``ENTROPY_CONTROLS`` is a pair
(``applied``, ``next``): the coefficient step k applies given the previous step's mean token entropy, and
the coefficient after step k given its own mean entropy H_k.

* ``fixed``     c_k = ``entropy_coef`` at every step.
* ``adaptive``  Skywork-OR1 (He et al., arXiv 2505.22312), as TRL 1.16's ``use_adaptive_entropy``:

                    c_{k+1} = min(c_k + delta, c_max)   if H_k <= H_target
                    c_{k+1} = max(c_k - delta, c_min)   otherwise

                and the bonus is applied only while the last measured entropy is at or below the target
                (none before the first measurement: H_0 = +inf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grpo.algorithms.params import NoParams, param, require


@dataclass(frozen=True)
class EntropyControlParams:
    target: float = param(0.2, "Target mean token entropy in nats (set it near the entropy of early training, "
                          "metric policy/entropy).")
    delta: float = param(0.005, "Change of the coefficient per optimizer step.")
    coef_min: float = param(0.0, "Lower bound of the coefficient.")
    coef_max: float = param(1.0, "Upper bound of the coefficient.")

    def __post_init__(self) -> None:
        require(0 <= self.coef_min <= self.coef_max and self.delta >= 0,
                "coef_min <= coef_max (both >= 0) and delta >= 0")


def fixed_applied(coef: float, last_entropy: float, p: EntropyControlParams) -> float:
    return coef


def fixed_next(coef: float, entropy: float, p: EntropyControlParams) -> float:
    return coef


def adaptive_applied(coef: float, last_entropy: float, p: EntropyControlParams) -> float:
    """c_k when H_{k-1} <= target, else 0."""
    return coef if last_entropy <= p.target else 0.0


def adaptive_next(coef: float, entropy: float, p: EntropyControlParams) -> float:
    """c_{k+1} = clamp(c_k +- delta, c_min, c_max): up while the entropy is at or below the target, else down."""
    if entropy <= p.target:
        return min(coef + p.delta, p.coef_max)
    return max(coef - p.delta, p.coef_min)


ENTROPY_CONTROLS: dict[str, tuple[Callable[[float, float, EntropyControlParams], float],
                                  Callable[[float, float, EntropyControlParams], float]]] = {
    "fixed": (fixed_applied, fixed_next),
    "adaptive": (adaptive_applied, adaptive_next),
}

ENTROPY_CONTROL_PARAMS: dict[str, type] = {"fixed": NoParams, "adaptive": EntropyControlParams}
