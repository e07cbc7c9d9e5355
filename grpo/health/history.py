"""A run's metric history as columns, and the few statistics the health rules share.

The history is metrics.jsonl's records in step order (``None``, JSON's stand-in for NaN, reads as NaN).
Notation of docs/health.md: B = the median of steps ``baseline_from``..``baseline_to`` of a metric;
Wn = its last n steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

SEVERITIES = {"info": 1, "warn": 2, "critical": 3}    # the level a finding's severity stands for in metrics


@dataclass(frozen=True)
class Finding:
    """What a rule found: `rule` is its registry name, `keys` the config keys its advice names."""

    rule: str
    severity: str                  # info | warn | critical
    message: str                   # what is wrong, with the numbers
    advice: str                    # what to change
    keys: tuple[str, ...] = ()
    step: int = 0
    value: float = float("nan")    # the number the threshold was applied to

    @property
    def level(self) -> int:
        return SEVERITIES[self.severity]

    def line(self) -> str:
        """The console line: `health: WARN dead_groups at step 42: ... -> ...`."""
        return f"health: {self.severity.upper()} {self.rule} at step {self.step}: {self.message} -> {self.advice}"

    def to_json(self) -> dict[str, Any]:
        value = self.value if math.isfinite(self.value) else None
        return {"step": self.step, "rule": self.rule, "severity": self.severity, "message": self.message,
                "advice": self.advice, "keys": list(self.keys), "value": value}


def _float(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


class History:
    """The step records seen so far (each a metrics.jsonl record: a dict with "step"), kept as records and as
    one column of floats per metric, so a rule's window costs no scan of the whole run."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()):
        self.records: list[dict[str, Any]] = []
        self.columns: dict[str, list[float]] = {}
        self._baselines: dict[tuple[str, int, int], float] = {}   # final once the run is past the window
        self.extend(records)

    def append(self, record: dict[str, Any]) -> None:
        n = len(self.records)
        for key, value in record.items():
            self.columns.setdefault(key, [float("nan")] * n).append(_float(value))
        for key, col in self.columns.items():
            if len(col) == n:                                          # a metric this step does not have
                col.append(float("nan"))
        self.records.append(record)

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.append(record)

    @property
    def step(self) -> int:
        return int(self.records[-1]["step"]) if self.records else 0

    def series(self, key: str) -> np.ndarray:
        """Every step's value of `key` (NaN where missing).  Shape: [steps]."""
        col = self.columns.get(key)
        return np.array(col, dtype=np.float64) if col is not None else np.full(len(self.records), np.nan)

    def last(self, key: str, n: int) -> np.ndarray:
        """W_n: the last n steps' values of `key`.  Shape: [min(n, steps)]."""
        col = self.columns.get(key)
        if col is None:
            return np.full(min(n, len(self.records)), np.nan)
        return np.array(col[-n:], dtype=np.float64)

    def has(self, key: str) -> bool:
        """Whether any step has a finite value of `key`."""
        return bool(np.isfinite(self.series(key)).any())

    def baseline(self, key: str, lo: int, hi: int) -> float:
        """B: the median of `key` over steps lo..hi (NaN when none is finite)."""
        if (key, lo, hi) in self._baselines:
            return self._baselines[key, lo, hi]
        steps = self.series("step")
        value = nanmedian(self.series(key)[(steps >= lo) & (steps <= hi)])
        if self.step > hi:
            self._baselines[key, lo, hi] = value
        return value

    def reward_names(self) -> list[str]:
        """The reward functions of the run in their configured order (the first is the main reward)."""
        names: list[str] = []
        for record in self.records[-1:]:
            for key in record:
                parts = key.split("/")
                if len(parts) == 3 and parts[0] == "reward" and parts[2] == "mean" and parts[1] != "total":
                    names.append(parts[1])
        return names


def nanmean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def nanmedian(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def mad(x: np.ndarray) -> float:
    """Median absolute deviation from the median (NaN left out)."""
    x = x[np.isfinite(x)]
    return float(np.median(np.abs(x - np.median(x)))) if x.size else float("nan")


def change(x: np.ndarray) -> float:
    """How much the least-squares line through `x` (one value per step, NaN left out) rises from the first
    to the last step of the window: slope x (n - 1). 0 for fewer than 2 finite values."""
    t = np.arange(x.size, dtype=np.float64)
    ok = np.isfinite(x)
    if ok.sum() < 2:
        return 0.0
    slope = np.polyfit(t[ok], x[ok], 1)[0]
    return float(slope * (x.size - 1))


def spike_flags(x: np.ndarray, mad_k: float, ratio: float, window: int = 100, min_prior: int = 10,
                tail: int | None = None) -> np.ndarray:
    """Which values are spikes: above median + mad_k x MAD and above ratio x median of the (up to) `window`
    values before them; a value with fewer than `min_prior` finite values before it, or after a median of 0 (a
    run that stopped moving: any motion would count), is never one.
    Only the last `tail` values are judged (the others stay False). Shape: [n] -> [n] bool."""
    flags = np.zeros(x.size, dtype=bool)
    for i in range(x.size - min(tail or x.size, x.size), x.size):
        prior = x[max(0, i - window):i]
        prior = prior[np.isfinite(prior)]
        if prior.size < min_prior or not np.isfinite(x[i]):
            continue
        med = float(np.median(prior))
        flags[i] = med > 0 and x[i] > med + mad_k * mad(prior) and x[i] > ratio * med
    return flags
