"""Experiment trackers that receive every step's scalars beside metrics.jsonl (``log.report_to``).

    log:
      report_to: [tensorboard, wandb, trackio]   # each needs its extra: pip install -e ".[wandb]"
      project: grpo                              # W&B / trackio project
      run_name: ""                               # empty = the name of train.output_dir

One small sink per tracker, named in :data:`TRACKERS`; each has ``log(step, scalars)`` and ``close()``.
:class:`grpo.state.metrics.MetricsLogger` opens them (rank 0 only: the other ranks have no logger), hands
each of them the numbers of every metrics.jsonl record and closes them at the end. A tracker whose
package is missing is a one-line ConfigError naming the extra, raised when the config is validated
(before anything is written to the output directory).

Where the data goes and what a resumed run does (docs/logging.md):
  tensorboard  SummaryWriter events in OUTPUT_DIR/tensorboard. Every run opens the writer with
               ``purge_step`` = its first step, so TensorBoard hides the events of steps from there on
               that an earlier run left in the directory: a resumed run replaces the steps after its
               checkpoint, as metrics.jsonl does.
  wandb        ``wandb.init(project, name, dir=OUTPUT_DIR, config=the resolved config)``: OUTPUT_DIR/wandb;
               WANDB_MODE (online | offline | disabled) is read by wandb itself. A resumed run is a new W&B
               run of the same name that starts at the resumed step.
  trackio      ``trackio.init(project, name, config)``: trackio's own SQLite store (TRACKIO_DIR, default
               the Hugging Face cache); a resumed run is a new trackio run of the same name.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.config import Config, ConfigError, to_dict
from grpo.config.checks import TRACKER_PACKAGES, install_hint, tracker_names  # noqa: F401  (names in the config)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is opened with."""

    output_dir: Path
    project: str
    name: str
    first_step: int                   # 1, or the step after the checkpoint a resumed run continues from
    config: dict[str, Any]            # the resolved config (grpo.config.to_dict)


class TensorBoardSink:
    """Scalars as TensorBoard events in OUTPUT_DIR/tensorboard (torch.utils.tensorboard.SummaryWriter)."""

    package = "tensorboard"

    def __init__(self, run: RunInfo):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events of steps >= first_step left by an earlier run in this directory are hidden
        self.writer = SummaryWriter(log_dir=str(run.output_dir / "tensorboard"), purge_step=run.first_step)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()           # one small write per step: the event file is always up to date

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run in OUTPUT_DIR/wandb (WANDB_MODE=offline needs no network nor account)."""

    package = "wandb"

    def __init__(self, run: RunInfo):
        import wandb

        self.run = wandb.init(project=run.project, name=run.name, dir=str(run.output_dir), config=run.config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioSink:
    """A trackio run in trackio's local store (TRACKIO_DIR); `trackio show` opens its dashboard."""

    package = "trackio"

    def __init__(self, run: RunInfo):
        import trackio

        self.trackio = trackio
        trackio.init(project=run.project, name=run.name, config=run.config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.trackio.log(scalars, step=step)

    def close(self) -> None:
        self.trackio.finish()


#: `log.report_to` name -> sink class (its `package` attribute is what must be importable).
TRACKERS: dict[str, type] = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "trackio": TrackioSink}


def tracker_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The values of a metrics record that trackers receive: numbers that are finite or NaN (NaN = not
    defined this step), as floats. `step` is the x-axis, not a scalar; strings, None, bools and +-inf are left out."""
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value) or math.isnan(value):
            out[key] = float(value)
    return out


def run_info(cfg: Config, first_step: int) -> RunInfo:
    """The RunInfo of a run of `cfg` whose first step is `first_step`."""
    out = Path(cfg.train.output_dir).expanduser()
    return RunInfo(output_dir=out, project=cfg.log.project, name=cfg.log.run_name or out.resolve().name,
                   first_step=first_step, config=to_dict(cfg))


def open_tracker(name: str, run: RunInfo):
    """One sink; a missing package is the one-line install hint (also for a Config built without validation)."""
    try:
        return TRACKERS[name](run)
    except ImportError as e:
        raise ConfigError(f"{install_hint(name)} ({e})") from None
    except Exception as e:             # e.g. wandb without a login: one line naming the tracker, not its traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"log.report_to: {name} failed to start: {type(e).__name__}: {first}") from None


def open_trackers(cfg: Config, first_step: int) -> list:
    """The sinks of `cfg.log.report_to` (none opened if one fails)."""
    names = tracker_names(cfg.log.report_to)
    if not names:
        return []
    run = run_info(cfg, first_step)
    sinks: list = []
    try:
        for name in names:
            sinks.append(open_tracker(name, run))
    except BaseException:
        close_trackers(sinks)
        raise
    return sinks


def close_trackers(sinks: list) -> None:
    """Close every sink; one that fails to close is reported and does not keep the others open."""
    for sink in sinks:
        try:
            sink.close()
        except Exception as e:        # the run's results are on disk already: warn, don't fail the run
            log.warning("warning: closing %s failed: %s", type(sink).__name__, e)
