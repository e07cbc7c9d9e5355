"""Checks on the output paths of `grpo eval | sample | reward-model | sft`, made before any work, so a bad
--out fails in one line naming it and nothing already written is replaced."""

from __future__ import annotations

from pathlib import Path

from grpo.config.checks import LOCK_FILE
from grpo.state.checkpoint import list_checkpoints

#: Files that mark a directory as a training run's output directory (with a checkpoint-* or the lock).
RUN_MARKERS = ("metrics.jsonl", "config.yaml")


def blocking_file(path: str | Path) -> Path | None:
    """The existing non-directory among `path`'s parents (which makes creating `path` fail), or None."""
    for parent in Path(path).expanduser().absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_parent(path: str | Path, flag: str) -> None:
    """`path` can be created: no parent of it is a file."""
    blocker = blocking_file(path)
    if blocker is not None:
        raise FileExistsError(f"{flag} {path}: {blocker} is a file, not a directory")


def training_run(path: str | Path) -> str | None:
    """What marks directory `path` as a training run's output directory (its lock, a checkpoint, its
    metrics.jsonl or config.yaml), or None."""
    out = Path(path)
    if not out.is_dir():
        return None
    if (out / LOCK_FILE).exists():
        return f"{LOCK_FILE}: a run may be writing there"
    checkpoints = list_checkpoints(out)
    if checkpoints:
        return f"newest checkpoint: {checkpoints[-1].name}"
    found = [name for name in RUN_MARKERS if (out / name).is_file()]
    return ", ".join(found) if found else None


def check_out_dir(path: str | Path, flag: str) -> Path:
    """`path` as an output directory that is not a file, under no file, and holds no training run."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{flag} {out} is a file, not a directory")
    check_parent(out, flag)
    run = training_run(out)
    if run:
        raise FileExistsError(f"{flag} {out} holds a training run ({run}): choose another directory")
    return out


def check_out_file(path: str | Path, flag: str) -> Path:
    """`path` as an output file: not a directory, and under no file."""
    out = Path(path)
    if out.is_dir():
        raise IsADirectoryError(f"{flag} {out} is a directory, not a file")
    check_parent(out, flag)
    return out
