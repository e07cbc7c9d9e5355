"""Training curves from metrics.jsonl (reward, accuracy, length, KL over steps)."""

from __future__ import annotations

from pathlib import Path

from grpo.health.figures import panel_grid
from grpo.state.metrics import read_metrics

PANELS = (("reward/total/mean", "total reward"), ("reward/accuracy/mean", "accuracy (train samples)"),
          ("completion/length_mean", "completion length (tokens)"), ("kl/mean", "KL to reference"))


def plot_curves(metrics_path: str | Path, out_png: str | Path, window: int = 10,
                panels: tuple[tuple[str, str], ...] = PANELS) -> Path:
    """Write a 2x2 figure of the headline metrics (`panels`: (key, title) each), each under its `window`-step
    moving average; steps without a value are skipped."""
    return panel_grid(read_metrics(metrics_path), panels, out_png, window)
