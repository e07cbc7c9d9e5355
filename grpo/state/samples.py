"""A few completions per step in output_dir/samples.jsonl (`log.samples_per_step`), for `grpo report`.

Each step keeps the best and the worst completion (by total reward) of its first groups: with k samples
per step, groups 0 .. ceil(k / 2) - 1 give their best and (k even, or not the last group) their worst.
One JSON object per sample: step, group, kind (best | worst), prompt, completion, total, per-function
rewards (null = the function did not apply), advantage.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from grpo.types import Experience

SAMPLES_FILE = "samples.jsonl"


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(float(x)) else None


def _text(x: Any) -> str:
    """A prompt or completion as text: chat messages become `role: content` lines."""
    if isinstance(x, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in x)
    return str(x)


def pick_samples(step: int, exp: Experience, group_size: int, k: int,
                 extra: dict[str, list] | None = None) -> list[dict[str, Any]]:
    """The step's `k` saved samples: best and worst (by total reward, NaN lowest) of the first groups;
    `extra`: columns of one value per completion (a reward's ``log_extra``), kept under ``extra``."""
    groups, out = exp.groups, []
    total = groups.total.detach().cpu().double()                                   # [N]
    adv = exp.advantages.values.detach().cpu().double()                            # [N] or [N, T]
    adv = adv if adv.dim() == 1 else adv[:, 0]
    names = exp.scored.names
    num_groups = total.numel() // group_size
    for g in range(min(num_groups, math.ceil(k / 2))):
        rows = torch.arange(g * group_size, (g + 1) * group_size, device="cpu")            # beside `total`
        scores = torch.nan_to_num(total[rows], nan=-math.inf)
        picks = [("best", int(rows[int(scores.argmax())]))]
        if len(out) + 2 <= k:
            picks.append(("worst", int(rows[int(scores.argmin())])))
        for kind, i in picks:
            out.append({"step": step, "group": g, "kind": kind, "prompt": _text(groups.prompts[i]),
                        "completion": _text(groups.completions[i]), "total": _num(total[i]),
                        "rewards": {n: _num(groups.per_function[i, j]) for j, n in enumerate(names)},
                        "advantage": _num(adv[i]), **({"extra": {c: v[i] for c, v in extra.items()}} if extra else {})})
    return out[:k]


def write_samples(path: Path, samples: list[dict[str, Any]]) -> None:
    """Append `samples` to the JSONL file at `path`."""
    if not samples:
        return
    with path.open("a") as fh:
        for s in samples:
            fh.write(json.dumps(s) + "\n")
