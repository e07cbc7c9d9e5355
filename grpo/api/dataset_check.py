"""The prompt-column check ``grpo.Trainer(...)`` runs on a training dataset's column names, before the model
loads: a dataset without a prompt column is refused there, not after the model is loaded at train().

Only column names are read (no rows are tokenized or validated here; train() checks every prompt):
in-memory records carry theirs; of a file, a Parquet schema, a CSV header, a ``save_to_disk`` directory
(memory-mapped), or a JSONL file's first row (every row's keys when that one lacks the column). A ``.json``
file is checked when train() reads it. The messages are grpo.data.datasets_io's.

:func:`stream_rows` turns a ``datasets.IterableDataset`` (TRL takes one) into the rows the run draws.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo.data.datasets_io import DataError, Records, rename_columns, require_column, scan_jsonl


def check_prompt_column(data: Any, records: Records | None) -> None:
    """Refuse a dataset without its prompt column: `records` (in memory), else ``data.dataset`` (a DataConfig's
    dataset, split, column_map and prompt_column); a dataset path that does not exist is refused too."""
    if records is not None:
        return check_columns(data, records.source, records.columns)
    if not data.dataset:
        return None                                   # the embedded task
    path = Path(data.dataset).expanduser()
    if not path.exists():
        raise DataError(f"dataset file not found: {path}")
    try:
        source, columns = column_names(path, data.split)
    except Exception:          # unreadable: train() reports it with the reader's own message
        return None
    if columns is None:
        return None
    try:
        check_columns(data, source, columns)
    except DataError:
        if path.suffix.lower() != ".jsonl":
            raise
        check_columns(data, source, scan_jsonl(path, skip_bad=True).columns)   # the first row lacked it
    return None


def check_columns(data: Any, source: str, columns: list[str]) -> None:
    """``data.column_map`` and ``data.prompt_column`` against `columns`, as grpo.data.datasets_io.read_dataset."""
    rec = Records([], [], source, list(columns))
    rename_columns(rec, dict(data.column_map))
    require_column(rec, data.prompt_column)


def column_names(path: Path, split: str) -> tuple[str, list[str] | None]:
    """(the dataset's name in messages, its column names, or None when they are not cheap to read)."""
    suffix = path.suffix.lower()
    if path.is_dir():
        from datasets import DatasetDict, load_from_disk

        ds = load_from_disk(str(path))
        if isinstance(ds, DatasetDict):
            return (f"{path}[{split}]", list(ds[split].column_names)) if split in ds else (str(path), None)
        return str(path), list(ds.column_names)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return str(path), list(pq.read_schema(path).names)
    if suffix == ".csv":
        import csv

        with path.open(newline="") as fh:
            return str(path), next(csv.reader(fh), None)
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line) if line.strip() else None
                if isinstance(row, dict):
                    return str(path), list(row)
    return str(path), None


#: An IterableDataset given as eval_dataset is read whole up to this many rows (more: pass ``ds.take(n)``).
EVAL_STREAM_LIMIT = 100_000


def stream_rows(dataset: Any, what: str, cfg: Any) -> Any:
    """A ``datasets.IterableDataset`` (TRL takes one) as a list of its rows, in the stream's order; anything else
    as it is. train_dataset: the first ``train.max_steps x train.prompts_per_step`` rows, every prompt the run
    draws (a shorter stream is read whole and its rows come round again by epoch, with a warning); a stream has no
    length, so ``train.num_train_epochs`` cannot give a step count (transformers also asks for max_steps then).
    eval_dataset: every row, up to :data:`EVAL_STREAM_LIMIT`. The rows are read once, so an exact resume needs a
    stream that gives the same rows again."""
    import itertools
    import warnings

    if type(dataset).__name__ != "IterableDataset":
        return dataset
    if what != "train_dataset":
        rows = list(itertools.islice(iter(dataset), EVAL_STREAM_LIMIT + 1))
        if len(rows) > EVAL_STREAM_LIMIT:
            raise DataError(f"{what}: the IterableDataset has more than {EVAL_STREAM_LIMIT} rows: pass ds.take(n)")
        return rows
    if cfg.train.num_train_epochs > 0:
        raise DataError(f"{what}: an IterableDataset has no length, so train.num_train_epochs (TRL: max_steps -1, "
                        "num_train_epochs) cannot give a step count: set max_steps")
    needed = cfg.train.max_steps * cfg.train.prompts_per_step
    rows = list(itertools.islice(iter(dataset), needed))
    if not rows:
        raise DataError(f"{what}: the IterableDataset gave no rows")
    if len(rows) < needed:
        warnings.warn(f"{what}: the IterableDataset ended after {len(rows)} rows of the {needed} that "
                      f"{cfg.train.max_steps} steps of {cfg.train.prompts_per_step} prompts draw: they come round "
                      "again by epoch", stacklevel=3)
    return rows
