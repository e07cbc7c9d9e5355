"""Reading prompt datasets from disk and checking their prompt column.

Formats: JSONL (read line by line, so errors name ``file:LINE``), and through the ``datasets``
library JSON, CSV, Parquet and directories written by ``Dataset.save_to_disk`` or
``DatasetDict.save_to_disk`` (a DatasetDict: the ``data.split`` split). Rows of the other
formats are named ``file: row I`` in errors (I = 0-based dataset index).

A prompt is either a non-empty string (standard format) or a non-empty list of
``{"role", "content"}`` messages (conversational format); one dataset uses one format.

A malformed row (invalid JSON line, not an object, missing / empty / ill-typed prompt, the other
prompt format) is an error naming it, or with ``data.skip_bad_rows`` is left out and counted
(``Records.skipped`` keeps each one's message).
"""

from __future__ import annotations

import csv
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from grpo.config import DataConfig

#: File suffix -> ``datasets`` builder (``.jsonl`` is read by :func:`scan_jsonl`).
BUILDERS = {".json": "json", ".csv": "csv", ".parquet": "parquet"}
SUPPORTED = "a .jsonl, .json, .csv or .parquet file, or a directory written by save_to_disk"


class DataError(ValueError):
    """A malformed dataset; the message names the file (and line or row)."""


@dataclass
class Records:
    """Raw rows of one dataset, where each row came from, and the dataset's name."""

    rows: list[dict[str, Any]]
    where: list[str]          # per row: "file:LINE" (JSONL) or "file: row I"
    source: str               # the dataset's name in messages (path, plus [split] for a DatasetDict)
    columns: list[str]        # column names, in first-seen order
    skipped: list[str] = field(default_factory=list)   # messages of rows left out (data.skip_bad_rows)


def _columns_of(rows: list[dict[str, Any]]) -> list[str]:
    """Union of the rows' keys, in first-seen order."""
    return list(dict.fromkeys(k for r in rows for k in r))


def _row_error(message: str, skipped: list[str] | None) -> None:
    """Raise DataError(message), or with skipping on (`skipped` is a list) record it and go on."""
    if skipped is None:
        raise DataError(message)
    skipped.append(message)


def scan_jsonl(path: str | Path, skip_bad: bool = False) -> Records:
    """Rows of a JSONL file; each non-blank line must be a JSON object (errors name file:LINE).

    With `skip_bad` such lines are left out and listed in ``Records.skipped`` instead.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"dataset file not found: {p}")
    rows, where, skipped = [], [], ([] if skip_bad else None)
    try:
        with p.open(encoding="utf-8") as fh:
            lines = list(fh)
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text (byte {e.start})") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            _row_error(f"{p}:{lineno}: invalid JSON ({e.msg})", skipped)
            continue
        if not isinstance(row, dict):
            _row_error(f"{p}:{lineno}: expected a JSON object per line, got {type(row).__name__}", skipped)
            continue
        rows.append(row)
        where.append(f"{p}:{lineno}")
    return Records(rows, where, str(p), _columns_of(rows), skipped or [])


def read_jsonl(path: str | Path, prompt_column: str = "prompt") -> list[dict[str, Any]]:
    """Rows of a JSONL prompt file; each must be an object with a valid prompt (string or messages)."""
    rec = scan_jsonl(path)
    for row, where in zip(rec.rows, rec.where):
        check_prompt(row.get(prompt_column), where, prompt_column)
    if not rec.rows:
        raise DataError(f"{rec.source}: no rows")
    return rec.rows


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def _csv_features(p: Path):
    """Every CSV column read as a string: no type guessing ('007' stays '007'); empty cells are None."""
    from datasets import Features, Value

    with p.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise DataError(f"{p}: no rows")
        for row in reader:              # more cells than the header: pandas would shift the row into its index
            if len(row) > len(header):
                raise DataError(f"{p}:{reader.line_num}: {len(row)} cells where the header has {len(header)} "
                                f"({', '.join(header)})")
    return Features({name: Value("string") for name in header})


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars while a local file is read (they would bury error lines)."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _load_file(p: Path) -> Records:
    """A JSON, CSV or Parquet file through ``datasets.load_dataset``."""
    from datasets import load_dataset

    builder = BUILDERS.get(p.suffix.lower())
    if builder is None:
        raise DataError(f"{p}: unsupported dataset format '{p.suffix}'; use {SUPPORTED}")
    kwargs = {"features": _csv_features(p)} if builder == "csv" else {}
    try:
        with _quiet_datasets():
            ds = load_dataset(builder, data_files=str(p), split="train", **kwargs)
    except Exception as e:  # the datasets/pyarrow error: keep its first line, name the file
        raise DataError(f"{p}: cannot read as {builder}: {_first_line(e)}") from e
    rows = ds.to_list()
    return Records(rows, [f"{p}: row {i}" for i in range(len(rows))], str(p), list(ds.column_names))


def _load_dir(p: Path, split: str) -> Records:
    """A directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (then: `split`)."""
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(p))
    except FileNotFoundError:
        raise DataError(f"{p}: not a dataset directory (expected one written by Dataset.save_to_disk "
                        f"or DatasetDict.save_to_disk)") from None
    source = str(p)
    if isinstance(ds, DatasetDict):
        if split not in ds:
            raise DataError(f"{p}: no split '{split}' (data.split); splits: {', '.join(ds)}")
        ds, source = ds[split], f"{p}[{split}]"
    rows = ds.to_list()
    return Records(rows, [f"{source}: row {i}" for i in range(len(rows))], source, list(ds.column_names))


def load_records(path: str | Path, split: str = "train", skip_bad: bool = False) -> Records:
    """The raw rows of a dataset file or save_to_disk directory (see the module docstring)."""
    p = Path(path).expanduser()
    if p.is_dir():
        rec = _load_dir(p, split)
    elif not p.is_file():
        raise DataError(f"dataset file not found: {p}")
    elif p.suffix.lower() == ".jsonl":
        rec = scan_jsonl(p, skip_bad)
    else:
        rec = _load_file(p)
    if not rec.rows:
        first = f" ({len(rec.skipped)} bad, first: {rec.skipped[0]})" if rec.skipped else ""
        raise DataError(f"{rec.source}: no rows{first}")
    return rec


def rename_columns(rec: Records, mapping: dict[str, str]) -> None:
    """Rename columns in place (``data.column_map``); unknown or clashing names are errors."""
    if not mapping:
        return
    missing = [c for c in mapping if c not in rec.columns]
    if missing:
        raise DataError(f"{rec.source}: data.column_map names column '{missing[0]}', which the dataset does not "
                        f"have (columns: {', '.join(rec.columns)})")
    clash = [t for s, t in mapping.items() if t in rec.columns and t not in mapping and t != s]
    if clash:
        raise DataError(f"{rec.source}: data.column_map renames a column to '{clash[0]}', but the dataset already "
                        f"has a '{clash[0]}' column")
    rec.rows = [{mapping.get(k, k): v for k, v in row.items()} for row in rec.rows]
    rec.columns = [mapping.get(c, c) for c in rec.columns]


def check_prompt(value: Any, where: str, column: str = "prompt") -> bool:
    """Validate one prompt; True for a message list (conversational), False for a string."""
    if isinstance(value, str) and value.strip():
        return False
    if isinstance(value, list) and value:
        for j, m in enumerate(value):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataError(f"{where}: column '{column}' message {j} must be an object with string "
                                f"'role' and 'content'")
        return True
    raise DataError(f"{where}: column '{column}' must be a non-empty string or a non-empty list of "
                    f"{{role, content}} messages, got {type(value).__name__}")


def records_from_rows(rows: list[dict[str, Any]], source: str = "train_dataset") -> Records:
    """In-memory rows (a list of dicts, e.g. from the Python API) as Records; rows must be dicts."""
    rows = list(rows)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{source}: row {i} must be a dict of columns, got {type(row).__name__}")
    if not rows:
        raise DataError(f"{source}: no rows")
    return Records([dict(r) for r in rows], [f"{source}: row {i}" for i in range(len(rows))], source,
                   _columns_of(rows))


def require_column(rec: Records, col: str) -> None:
    """A one-line DataError naming the source and its columns when the prompt column `col` is missing."""
    if col not in rec.columns:
        hint = ("data.prompt_column" if col != "prompt"
                else "set data.column_map (e.g. {question: prompt}) or data.prompt_column")
        raise DataError(f"{rec.source}: no column '{col}' ({hint}); columns: {', '.join(rec.columns)}")


def read_dataset(cfg: DataConfig, rec: Records | None = None) -> tuple[Records, bool]:
    """Load `cfg.dataset` (or take the in-memory `rec`), apply column_map and prompt_column, check every prompt.

    Returns the records (each row has a ``prompt``) and whether the prompts are conversational.
    ``data.prompt_column`` copies that column to ``prompt`` (the original column is kept too).
    """
    if rec is None:
        rec = load_records(cfg.dataset, cfg.split, cfg.skip_bad_rows)
    else:
        rec = Records(list(rec.rows), list(rec.where), rec.source, list(rec.columns), list(rec.skipped))
    rename_columns(rec, dict(cfg.column_map))
    col = cfg.prompt_column
    require_column(rec, col)
    if col != "prompt":
        rec.rows = [dict(row, prompt=row.get(col)) for row in rec.rows]
    return rec, check_rows(rec, col, cfg.skip_bad_rows)


def _prompt_kind(row: dict[str, Any], where: str, column: str, skipped: list[str] | None) -> bool | None:
    """check_prompt of one row; None when it is bad and skipping is on (the message is recorded)."""
    try:
        return check_prompt(row.get("prompt"), where, column)
    except DataError as e:
        _row_error(str(e), skipped)
        return None


def check_rows(rec: Records, column: str, skip_bad: bool = False) -> bool:
    """Check every row's prompt (one format per dataset); True when they are chat messages.

    With `skip_bad` bad rows (and rows in the other format than the first good one) are removed
    from `rec` and their messages appended to ``rec.skipped``; no good row at all is an error.
    """
    skipped = rec.skipped if skip_bad else None
    name = {True: "a list of messages", False: "a string"}
    keep, first = [], None
    for i, (row, where) in enumerate(zip(rec.rows, rec.where)):
        kind = _prompt_kind(row, where, column, skipped)
        if kind is None:
            continue
        if first is None:
            first = kind
        elif kind != first:
            _row_error(f"{where}: prompt is {name[kind]} but earlier prompts are {name[first]}; "
                       f"use one prompt format per dataset", skipped)
            continue
        keep.append(i)
    if first is None:
        raise DataError(f"{rec.source}: no valid rows ({len(rec.skipped)} bad, first: {rec.skipped[0]})")
    rec.rows, rec.where = [rec.rows[i] for i in keep], [rec.where[i] for i in keep]
    return first
