"""Prompt datasets: the embedded task or a JSONL file, a seeded epoch order, tokenization."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from grpo.config import ConfigError, DataConfig
from grpo.types import PromptBatch


class DataError(ValueError):
    """A malformed dataset; the message names the file and line."""


def read_jsonl(path: str | Path, prompt_column: str = "prompt") -> list[dict[str, Any]]:
    """Rows of a JSONL prompt file; each must be an object with a non-empty string prompt."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"dataset file not found: {p}")
    rows = []
    with p.open() as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{p}:{lineno}: expected a JSON object per line")
            prompt = row.get(prompt_column)
            if not isinstance(prompt, str) or not prompt:
                raise DataError(f"{p}:{lineno}: column '{prompt_column}' must be a non-empty string")
            rows.append(row)
    if not rows:
        raise DataError(f"{p}: no rows")
    return rows


def load_prompt_rows(cfg: DataConfig, seed: int = 0) -> list[dict[str, Any]]:
    """The training prompts: a JSONL file, or the embedded task's train split."""
    if cfg.dataset:
        rows = read_jsonl(cfg.dataset, cfg.prompt_column)
        return [dict(r, prompt=r[cfg.prompt_column]) if cfg.prompt_column != "prompt" else r for r in rows]
    from grpo.tasks import TASKS

    if cfg.task not in TASKS:
        raise ConfigError(f"data.task must be one of {sorted(TASKS)}, got '{cfg.task}'")
    return TASKS[cfg.task].generate("train", cfg.num_train_prompts, seed=seed)


class PromptStream:
    """An endless, seeded sequence of prompt rows: a fresh permutation every epoch."""

    def __init__(self, rows: list[dict[str, Any]], seed: int, shuffle: bool = True):
        self.rows, self.shuffle = rows, shuffle
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.epoch = 0

    def next(self, n: int) -> list[dict[str, Any]]:
        out = []
        while len(out) < n:
            if not self.order:
                self.epoch += 1
                perm = torch.randperm(len(self.rows), generator=self.generator) if self.shuffle else torch.arange(len(self.rows))
                self.order = perm.tolist()
            out.append(self.rows[self.order.pop(0)])
        return out


def tokenize_prompts(tokenizer, rows: list[dict[str, Any]], device: torch.device | str = "cpu") -> PromptBatch:
    """Left-padded prompt ids and the other columns (B values each)."""
    prompts = [r["prompt"] for r in rows]
    enc = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
    columns = {k: [r.get(k) for r in rows] for k in sorted({k for r in rows for k in r} - {"prompt"})}
    return PromptBatch(prompts=prompts, prompt_ids=enc["input_ids"].to(device),           # [B, P]
                       prompt_mask=enc["attention_mask"].to(device), columns=columns)     # [B, P]
