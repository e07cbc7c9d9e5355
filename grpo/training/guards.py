"""Step-level guards of the training loop: deterministic mode and the limit on consecutive
non-finite steps (TrainingError)."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite steps); one line naming the last good checkpoint."""



@contextmanager
def deterministic_mode(enabled: bool) -> Iterator[None]:
    """With `enabled`: deterministic torch kernels (an op without one raises), deterministic cuDNN, no
    cuDNN autotuning, a fixed cuBLAS workspace. The previous settings come back on exit."""
    if not enabled:
        yield
        return
    cudnn = torch.backends.cudnn
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                cudnn.deterministic, cudnn.benchmark)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # needed by deterministic cuBLAS (CUDA >= 10.2)
    torch.use_deterministic_algorithms(True)
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        cudnn.deterministic, cudnn.benchmark = previous[2], previous[3]


class BadSteps:
    """Counts consecutive steps whose update was skipped (non-finite loss or gradient norm)."""

    def __init__(self, limit: int):
        self.limit, self.streak = limit, 0

    def record(self, step: int, bad: bool) -> bool:
        """Note one step; True (and a warning) when it was bad."""
        self.streak = self.streak + 1 if bad else 0
        if bad:
            log.warning("warning: step %d: non-finite loss or gradient norm, update skipped (%d in a row)",
                        step, self.streak)
        return bad

    def check(self, step: int, last_good: Path | None) -> None:
        """TrainingError once `limit` (> 0) bad steps came in a row; nothing is saved of that state."""
        if self.limit and self.streak >= self.limit:
            raise TrainingError(f"{self.streak} consecutive steps ({step - self.streak + 1}-{step}) had a non-finite "
                                f"loss or gradient norm (train.max_bad_steps={self.limit}); stopped without saving; "
                                f"last good checkpoint: {last_good or 'none'}")
