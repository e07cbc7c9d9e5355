"""`grpo rewards check`: score a JSONL file of completions with reward functions, without training.

The file format is in ``grpo rewards check --help`` (grpo/cli/main.py CHECK_DESCRIPTION): per line a
``completion``, and a ``prompt`` with columns inline and/or an ``index`` into the dataset
(data.dataset, with data.column_map / data.prompt_column applied), whose row is joined in. All
completions are scored in one call, by keyword as in training (``fn(prompts=, completions=,
**columns)``), with reward.weights and reward.reward_errors of the config.
Errors name ``file:LINE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo.cli.common import resolve_given
from grpo.config import Config
from grpo.data.datasets_io import DataError, read_dataset, scan_jsonl
from grpo.rewards import RewardError, load_reward, score
from grpo.rewards.text import chat_completions
from grpo.types import Scored

#: Keys of a completions row that are not reward columns.
CONTROL_KEYS = ("completion", "index")


@dataclass
class CompletionSet:
    """The completions to score, with their prompts and columns (one value per completion)."""

    prompts: list[Any]
    completions: list[Any]
    columns: dict[str, list[Any]]
    where: list[str]            # "file:LINE" of each completion


def check_config(config: str | None, rewards: list[str] | None, dataset: str | None, reward_errors: str | None,
                 extra: list[str]) -> Config:
    """The config the check uses, read as `grpo train` reads it (a `trl grpo` recipe too): defaults < --config
    < TRL names < --section.key < the command's own flags."""
    flags = {"reward.functions": rewards, "data.dataset": dataset, "reward.reward_errors": reward_errors}
    return resolve_given(config, extra, {k: v for k, v in flags.items() if v is not None})


def dataset_rows(cfg: Config) -> list[dict[str, Any]] | None:
    """The rows of data.dataset (column_map and prompt_column applied), or None without one."""
    return read_dataset(cfg.data)[0].rows if cfg.data.dataset else None


def joined_row(row: dict[str, Any], where: str, dataset: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A completions row with the dataset row it points to joined in (the row's own keys win)."""
    completion = row.get("completion")
    if not isinstance(completion, (str, list)):
        raise DataError(f"{where}: 'completion' must be a string or a list of chat messages, "
                        f"got {type(completion).__name__}")
    index = row.get("index")
    if index is None:
        if "prompt" not in row:
            raise DataError(f"{where}: needs a 'prompt' or an 'index' into --dataset")
        return row
    if dataset is None:
        raise DataError(f"{where}: 'index' needs a dataset (--dataset or data.dataset)")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(dataset):
        raise DataError(f"{where}: 'index' must be a row number in 0..{len(dataset) - 1} of the dataset, got {index!r}")
    return {**dataset[index], **row}


def read_completions(path: str | Path, dataset: list[dict[str, Any]] | None) -> CompletionSet:
    """The completions file as prompts, completions and columns (errors name file:LINE).

    As in training, a text completion of a chat-message prompt reaches the rewards as
    ``[{"role": "assistant", "content": text}]``."""
    if not Path(path).is_file():
        raise DataError(f"completions file not found: {path}")
    rec = scan_jsonl(path)
    if not rec.rows:
        raise DataError(f"{rec.source}: no completions")
    rows = [joined_row(row, where, dataset) for row, where in zip(rec.rows, rec.where)]
    names = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in (*CONTROL_KEYS, "prompt")]
    prompts = [r.get("prompt") for r in rows]
    return CompletionSet(prompts, chat_completions(prompts, [r["completion"] for r in rows]),
                         {k: [r.get(k) for r in rows] for k in names}, rec.where)


def _stats(values: torch.Tensor) -> tuple[float, float, int]:
    """(mean over the finite entries, share of NaN entries, number of finite entries)."""
    finite = values[~torch.isnan(values)]
    mean = float(finite.mean()) if finite.numel() else float("nan")
    return mean, float(torch.isnan(values).float().mean()), int(finite.numel())


def format_table(scored: Scored) -> str:
    """One line per reward function and one for the weighted total: mean, share of None, errors, n
    (n = completions that got a value; the mean is over those)."""
    rows = [(name, scored.per_function[:, k], scored.errors.get(name, 0)) for k, name in enumerate(scored.names)]
    rows.append(("total", scored.total, sum(scored.errors.values())))
    width = max(len("reward"), *(len(name) for name, _, _ in rows))
    lines = [f"{'reward':{width}s} {'mean':>9s} {'none':>7s} {'errors':>7s} {'n':>6s}"]
    for name, values, errors in rows:
        mean, none, n = _stats(values)
        shown = f"{mean:9.4f}" if math.isfinite(mean) else f"{'-':>9s}"
        lines.append(f"{name:{width}s} {shown} {none:7.1%} {errors:7d} {n:6d}")
    return "\n".join(lines)


def run_check(cfg: Config, completions_path: str | Path) -> str:
    """Score the completions file with the config's reward functions; the table to print."""
    from grpo.data.tasks import default_reward_functions

    rewards = [load_reward(spec) for spec in cfg.reward.functions]
    data = read_completions(completions_path, dataset_rows(cfg))
    if not rewards:                     # none named: only the embedded task has defaults, a file needs --reward
        rewards = [load_reward(spec) for spec in default_reward_functions(cfg, cfg.data.dataset or str(completions_path))]
    try:
        scored = score(rewards, cfg.reward.weights, data.prompts, data.completions, data.columns,
                       on_error=cfg.reward.reward_errors, timeout_s=cfg.reward.timeout_s)
    except RewardError as e:
        where = data.where[e.index] if e.index is not None else str(completions_path)
        raise RewardError(f"{where}: {e}", e.index) from None
    return f"scored {len(data.completions)} completions from {completions_path}\n{format_table(scored)}"
