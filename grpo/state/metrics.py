"""Namespaced step metrics (`reward/accuracy/mean`, `loss/policy`, `kl/mean`, ...) and their sinks."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch

from grpo.algorithms.rollout_stats import pearson
from grpo.config import Config
from grpo.state.tracking import close_trackers, open_trackers, tracker_scalars
from grpo.types import Scored, StepSummary


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
        out[f"reward/{name}/max"] = float(vals.max()) if vals.numel() else float("nan")
        out[f"reward/{name}/none_frac"] = float(torch.isnan(col).float().mean())
    for name, count in scored.errors.items():                              # reward.reward_errors: zero
        out[f"reward/{name}/errors"] = float(count)
    return out


def completion_metrics(exp: StepSummary) -> dict[str, float]:
    """Length, truncation and repetition of the sampled completions, and how length and reward go together
    (what the health rules read, grpo/health/)."""
    lengths = exp.completion_mask.sum(dim=1).float()                        # [N]
    out = {"completion/length_mean": float(lengths.mean()), "completion/length_max": float(lengths.max()),
           "completion/truncated_frac": float(exp.truncated.float().mean()),
           "completion/length_reward_corr": pearson(lengths, exp.scored.total.to(lengths.device))}
    if exp.repeated.numel():                                                # share with a 4-gram repeated >= 8 times
        out["completion/repetition_frac"] = float(exp.repeated.float().mean())
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null means "not defined this step"
    return value


def step_metrics(step: int, exp: StepSummary, u: dict[str, float], times: dict[str, float], prompt_set) -> dict[str, Any]:
    """One metrics.jsonl record: the experience's summary `exp`, the mean update stats `u`, timings, data counts."""
    return {
        "step": step, **reward_metrics(exp.scored), **completion_metrics(exp),
        **exp.metrics, "advantages/zero_std_frac": exp.zero_std_groups / exp.num_groups,
        "loss/total": u["loss"], "loss/policy": u["policy_loss"], "loss/kl": u["kl_loss"],
        "kl/mean": u["kl"], "policy/clip_frac": u["clip_fraction"], "policy/entropy": u["entropy"],
        "policy/clip_high_frac": u["clip_high_fraction"], "policy/clip_low_frac": u["clip_fraction"] - u["clip_high_fraction"],
        "rollout/logprob_diff": exp.metrics.get("rollout/logprob_diff", u["rollout_logprob_diff"]),
        "rollout/logp_diff": exp.metrics.get("rollout/logprob_diff", u["rollout_logprob_diff"]),  # alias of the same value
        "optim/grad_norm": u["grad_norm"], "optim/lr": u["lr"], "optim/skipped_steps": u["skipped"],
        "time/step_s": times["step_s"], "time/rollout_s": exp.sample_s, "time/experience_s": times["experience_s"],
        "time/update_s": times["update_s"],
        "rollout/tokens_per_s": float(exp.completion_mask.sum()) / max(exp.sample_s, 1e-9),
        "data/dropped_prompts": prompt_set.num_dropped, "data/truncated_prompts": prompt_set.num_truncated,
        "data/skipped_rows": prompt_set.num_skipped,
    }


class MetricsLogger:
    """Appends one JSON object per step to a file, drives an optional tqdm progress bar and hands each
    record's numbers to the trackers of `config.log.report_to` (grpo/state/tracking.py).

    `initial` is the number of steps already done (a resumed run; see truncate_metrics). The file and
    the trackers are opened by the first record, so a run that fails before its first step is logged
    writes nothing to the output directory (grpo.state.resume.begin_run).
    """

    HEADLINE = (("reward/total/mean", "reward"), ("completion/length_mean", "len"), ("kl/mean", "kl"))

    def __init__(self, path: Path, total_steps: int, progress_bar: bool = True, initial: int = 0,
                 config: Config | None = None):
        self.path, self.config, self.initial = path, config, initial
        self.fh: Any = None
        self.trackers: list = []
        self.bar = None
        if progress_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=initial, desc="grpo", unit="step", dynamic_ncols=True)

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_trackers(self) -> None:
        """Open the trackers of `log.report_to` (once). The loop calls it before its first write to the output
        directory (begin_run), so a tracker that cannot start leaves an existing run's files as they were."""
        if self.config is not None and not self.trackers:
            self.trackers = open_trackers(self.config, first_step=self.initial + 1)

    def _open(self) -> None:
        """Open the file (appending) and, if not yet open, the trackers of `log.report_to`."""
        self.start_trackers()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = self.path.open("a")

    def sync(self) -> None:
        """Flush the records to the disk (before a checkpoint, so none it covers can be lost)."""
        if self.fh is None:
            return
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def log(self, metrics: dict[str, Any]) -> None:
        if self.fh is None:
            self._open()
        self.fh.write(json.dumps({k: _clean(v) for k, v in metrics.items()}) + "\n")
        self.fh.flush()
        if self.trackers:
            scalars = tracker_scalars(metrics)                             # the same numbers for every tracker
            for tracker in self.trackers:
                tracker.log(metrics["step"], scalars)
        if self.bar is not None:
            first = next((k for k in metrics if k.startswith("reward/") and k.endswith("/mean")
                          and k != "reward/total/mean"), None)          # the first reward function's mean
            headline = [*self.HEADLINE[:1], *([(first, first.split("/")[1][:10])] if first else []), *self.HEADLINE[1:]]
            shown = {label: f"{metrics[k]:.3g}" for k, label in headline
                     if isinstance(metrics.get(k), float) and math.isfinite(metrics[k])}
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """Close the progress bar, the file and the trackers (a second call does nothing)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.fh is not None and not self.fh.closed:
            self.fh.close()
            close_trackers(self.trackers)


ALERTS_FILE = "alerts.jsonl"     # the health rules' findings (grpo/health/monitor.py), one JSON object per line


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All step records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def truncate_metrics(path: str | Path, step: int) -> int:
    """Keep the records of steps <= `step` (a torn last line goes too); returns how many lines were dropped.

    A run resumed at step S calls it with S, so the finished file equals an uninterrupted run's.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    keep, dropped, unreadable = [], 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            ok = int(json.loads(line)["step"]) <= step
        except (ValueError, KeyError, TypeError):
            ok = False
            unreadable += [number] if line.strip() else []
        if ok:
            keep.append(line)
        elif line.strip():
            dropped += 1
    if unreadable:              # a torn last line is a killed step's, redone; say so, and of any other
        logging.getLogger(__name__).warning(
            "warning: %s: line%s %s %s not a step record (torn or edited); dropped", path,
            "s" if len(unreadable) > 1 else "", ", ".join(map(str, unreadable[:5])), "are" if len(unreadable) > 1 else "is")
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in keep))
        os.replace(tmp, path)
    return dropped
