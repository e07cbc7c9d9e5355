"""Namespaced step metrics (`reward/accuracy/mean`, `loss/policy`, `kl/mean`, ...) and their sinks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from grpo.types import Scored


def reward_metrics(scored: Scored) -> dict[str, float]:
    """Mean and std of the total and of each reward function (None values left out)."""
    total = scored.total[~torch.isnan(scored.total)]                        # NaN = no function applied
    out = {"reward/total/mean": float(total.mean()) if total.numel() else float("nan"),
           "reward/total/std": float(total.std(unbiased=False)) if total.numel() else float("nan")}
    for k, name in enumerate(scored.names):
        col = scored.per_function[:, k]
        vals = col[~torch.isnan(col)]
        out[f"reward/{name}/mean"] = float(vals.mean()) if vals.numel() else float("nan")
        out[f"reward/{name}/std"] = float(vals.std(unbiased=False)) if vals.numel() else float("nan")
        out[f"reward/{name}/none_frac"] = float(torch.isnan(col).float().mean())
    for name, count in scored.errors.items():                              # reward.reward_errors: zero
        out[f"reward/{name}/errors"] = float(count)
    return out


def completion_metrics(completion_mask: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """Length statistics of the sampled completions.  Shape: [N, T], [N]."""
    lengths = completion_mask.sum(dim=1).float()                            # [N]
    return {"completion/length_mean": float(lengths.mean()), "completion/length_max": float(lengths.max()),
            "completion/truncated_frac": float(truncated.float().mean())}


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null means "not defined this step"
    return value


class MetricsLogger:
    """Appends one JSON object per step to a file and drives an optional tqdm progress bar."""

    HEADLINE = (("reward/total/mean", "reward"), ("reward/accuracy/mean", "acc"),
                ("completion/length_mean", "len"), ("kl/mean", "kl"))

    def __init__(self, path: Path, total_steps: int, progress_bar: bool = True):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = path.open("a")
        self.bar = None
        if progress_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, desc="grpo", unit="step", dynamic_ncols=True)

    def log(self, metrics: dict[str, Any]) -> None:
        self.fh.write(json.dumps({k: _clean(v) for k, v in metrics.items()}) + "\n")
        self.fh.flush()
        if self.bar is not None:
            shown = {label: f"{metrics[k]:.3g}" for k, label in self.HEADLINE
                     if isinstance(metrics.get(k), float) and math.isfinite(metrics[k])}
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        self.fh.close()
        if self.bar is not None:
            self.bar.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All step records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
