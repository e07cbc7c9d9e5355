"""Checkpoints: `output_dir/checkpoint-<step>/` in Hugging Face format plus the trainer state.

A checkpoint holds the policy (`save_pretrained` of the full model, or of the LoRA adapter only),
the tokenizer, `optimizer.pt` (optimizer and scheduler state), `rng_state.pt` (python, numpy and
torch generators, the sampling generator and the prompt order), `reference.safetensors` (only when
the reference policy is refreshed during training), `trainer_state.json` (step, config) and, written
last, `manifest.json`: the size and sha256 of every other file. :func:`verify_checkpoint` checks
them, so a torn or corrupted checkpoint is never resumed from.

Writing is atomic: everything goes to a hidden `.checkpoint-<step>.tmp` directory (fsynced) that is
renamed into place; a failing write (disk full, ...) removes it and raises one-line
:class:`CheckpointWriteError`, leaving earlier checkpoints untouched. Hidden names (`.tmp`, `.old`,
`.deleting`) never match `checkpoint-<step>`, so leftovers of a crash cannot be mistaken for a
checkpoint; :func:`remove_stale_temporaries` clears them. `grpo export` turns one into a merged model.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.signals import fault_point

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STALE_RE = re.compile(r"^\.checkpoint-\d+\.(tmp|old|deleting)$")
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (incomplete, corrupted, unparsable); one line naming it."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (e.g. disk full); the earlier checkpoints are intact."""


def checkpoint_step(path: str | Path) -> int:
    """The step of a `checkpoint-<step>` directory name."""
    m = CHECKPOINT_RE.match(Path(path).name)
    if m is None:
        raise CheckpointError(f"{path}: not a checkpoint-<step> directory")
    return int(m.group(1))


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint directories of a run (complete or not: see verify_checkpoint), oldest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def rng_state(sample_generator: torch.Generator | None = None, stream_state: Any = None) -> dict[str, Any]:
    """Every random state a resumed run needs, as tensors and plain values (loads with weights_only)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "sampler": None if sample_generator is None else sample_generator.get_state(),
            "stream": stream_state}


def restore_rng(state: dict[str, Any], sample_generator: torch.Generator | None = None) -> None:
    """Set the generators saved by :func:`rng_state` (the stream state is restored by PromptStream)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if sample_generator is not None and state.get("sampler") is not None:
        sample_generator.set_state(state["sampler"])


def file_sha256(path: Path, sync: bool = False) -> str:
    """Hex sha256 of a file's bytes; with `sync`, its data is flushed to the disk first."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        if sync:
            os.fsync(fh.fileno())
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, step: int) -> Path:
    """manifest.json: size and sha256 of every file of `directory` (fsynced); written last."""
    files = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p, sync=True)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}
    path = directory / MANIFEST
    with path.open("w") as fh:
        json.dump({"format": MANIFEST_FORMAT, "step": step, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(directory)
    return path


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """The manifest of a complete, intact checkpoint; CheckpointError naming what is wrong otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"{path.name}: no {MANIFEST} (incomplete write)")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = {str(k): (int(v["size"]), str(v["sha256"])) for k, v in manifest["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{path.name}: {MANIFEST} is unreadable") from None
    for rel, (size, sha) in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"{path.name}: missing file {rel}")
        if f.stat().st_size != size:
            raise CheckpointError(f"{path.name}: {rel} has {f.stat().st_size} bytes, the manifest says {size}")
        if file_sha256(f) != sha:
            raise CheckpointError(f"{path.name}: {rel} does not match its sha256 in {MANIFEST}")
    return manifest


def _discard(path: Path) -> None:
    """Remove a directory: first renamed to a hidden name, so a crash never leaves a torn checkpoint."""
    if not path.exists():
        return
    hidden = path.with_name(f".{path.name}.deleting")
    shutil.rmtree(hidden, ignore_errors=True)
    os.replace(path, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished temporary into place (replacing an older `final`)."""
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def remove_stale_temporaries(output_dir: str | Path) -> list[str]:
    """Delete the hidden leftovers of interrupted checkpoint writes; returns their names."""
    out = Path(output_dir)
    stale = [p for p in out.iterdir() if STALE_RE.match(p.name)] if out.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in stale]


def prune_checkpoints(output_dir: str | Path, keep: int, newest_step: int) -> None:
    """Keep the newest `keep` checkpoints up to `newest_step` (0 = keep all)."""
    if keep > 0:
        done = [p for p in list_checkpoints(output_dir) if checkpoint_step(p) <= newest_step]
        for old in done[:-keep]:
            _discard(old)


def _write_files(tmp: Path, step: int, model, tokenizer, optimizer, scheduler, state, rng, reference) -> None:
    from grpo.export import save_checkpoint_model
    from safetensors.torch import save_model

    save_checkpoint_model(model, tokenizer, tmp)   # LoRA: only the adapter (it names its base model)
    fault_point("save", step)
    if optimizer is not None:
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": None if scheduler is None else scheduler.state_dict()}, tmp / "optimizer.pt")
    if rng is not None:
        torch.save(rng, tmp / "rng_state.pt")
    if reference is not None:
        save_model(reference, str(tmp / "reference.safetensors"))
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=1, default=str))
    write_manifest(tmp, step)


def save_checkpoint(output_dir: str | Path, step: int, model, tokenizer, *, optimizer=None, scheduler=None,
                    state: dict[str, Any] | None = None, rng: dict[str, Any] | None = None,
                    reference: torch.nn.Module | None = None, save_total_limit: int = 0) -> Path:
    """Write `output_dir/checkpoint-<step>` atomically; keep the newest `save_total_limit` (0 = all).

    `reference` (a module) is stored as reference.safetensors. On any failure the temporary
    directory is removed; an OSError becomes a one-line CheckpointWriteError.
    """
    out = Path(output_dir)
    final, tmp = out / f"checkpoint-{step}", out / f".checkpoint-{step}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _write_files(tmp, step, model, tokenizer, optimizer, scheduler, state, rng, reference)
        _publish(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            reason = f"{e.strerror} ({e.filename})" if e.strerror and e.filename else (e.strerror or str(e))
            raise CheckpointWriteError(f"writing checkpoint {final} failed: {reason}; "
                                       f"earlier checkpoints are intact") from e
        raise
    prune_checkpoints(out, save_total_limit, step)
    return final
