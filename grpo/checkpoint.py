"""Checkpoints: `output_dir/checkpoint-<step>/` in Hugging Face format plus the trainer state.

A checkpoint holds the policy (`save_pretrained` of the full model, or of the LoRA adapter only),
the tokenizer, `optimizer.pt` (optimizer and scheduler state), `rng_state.pt` (python, numpy and
torch generators, the sampling generator and the prompt order) and `trainer_state.json` (step,
config). It is written to a hidden temporary directory and renamed into place, so a crash while
saving never leaves a half-written `checkpoint-<step>`. `grpo export` turns one into a merged model.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.export import save_checkpoint_model

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Completed checkpoints of a run, oldest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def rng_state(sample_generator: torch.Generator | None = None, stream_state: Any = None) -> dict[str, Any]:
    """Every random state a resumed run needs."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "sampler": None if sample_generator is None else sample_generator.get_state(),
            "stream": stream_state}


def save_checkpoint(output_dir: str | Path, step: int, model, tokenizer, *, optimizer=None, scheduler=None,
                    state: dict[str, Any] | None = None, rng: dict[str, Any] | None = None,
                    save_total_limit: int = 0) -> Path:
    """Write `output_dir/checkpoint-<step>` atomically; keep the newest `save_total_limit` (0 = all)."""
    out = Path(output_dir)
    final, tmp = out / f"checkpoint-{step}", out / f".checkpoint-{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_checkpoint_model(model, tokenizer, tmp)   # LoRA: only the adapter (it names its base model)
    if optimizer is not None:
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": None if scheduler is None else scheduler.state_dict()}, tmp / "optimizer.pt")
    if rng is not None:
        torch.save(rng, tmp / "rng_state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=1, default=str))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if save_total_limit > 0:
        for old in list_checkpoints(out)[:-save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final
