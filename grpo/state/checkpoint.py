"""Checkpoints: `output_dir/checkpoint-<step>/` in Hugging Face format plus the trainer state.

A checkpoint holds the policy (`save_pretrained` of the full model, or of the LoRA adapter only),
the tokenizer, `optimizer.pt` (optimizer and scheduler state, and fp16's loss scale), `rng_state.pt` (python, numpy and
torch generators and the prompt order, whose positions also key the sampling: grpo/rollout/keyed.py), `reference.safetensors` (only when
the reference policy is refreshed during training), `trainer_state.json` (step, config) and, written
last, `manifest.json`: the size and sha256 of every other file. :func:`verify_checkpoint` checks
them, so a torn or corrupted checkpoint is never resumed from.

Writing is atomic: everything goes to a hidden `.checkpoint-<step>.tmp` directory (fsynced) that is
renamed into place; a failing write (disk full, ...) removes it and raises one-line
:class:`CheckpointWriteError` naming the file and the OS's reason, leaving earlier checkpoints
untouched (torch.save and safetensors report a full disk as RuntimeError / SafetensorError; the reason
is recovered from the message or by a probe write). Every file gets the mode the umask gives a new
file (safetensors writes 0600 temporaries). Hidden names (`.tmp`, `.old`,
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
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from grpo.accelerator import accelerator
from grpo.events import emit

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STALE_RE = re.compile(r"^\.checkpoint-\d+\.(tmp|old|deleting)$")
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
#: What a checkpoint's manifest must list besides its other files: (description, any one of these names).
REQUIRED_FILES = (("trainer_state.json", ("trainer_state.json",)),
                  ("model config", ("config.json", "adapter_config.json")),
                  ("policy weights", ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                                      "pytorch_model.bin", "adapter_model.bin")))
#: "... (os error 28)": how Rust libraries (safetensors) carry the errno in their message.
OS_ERROR_RE = re.compile(r"os error (\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (incomplete, corrupted, unparsable); one line naming it."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (e.g. disk full); the earlier checkpoints are intact."""


class _FileWriteFailed(Exception):
    """A failure while writing `path` (inside save_checkpoint only: it becomes a CheckpointWriteError)."""

    def __init__(self, path: Path, cause: Exception):
        super().__init__(str(cause))
        self.path, self.cause = path, cause


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Attribute an I/O failure inside the block to `path` (a file, or the directory save_pretrained fills)."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as e:   # torch and safetensors: RuntimeError-like on ENOSPC
        raise _FileWriteFailed(path, e) from e


def probe_write(directory: Path, size: int = 1 << 20) -> str | None:
    """The OS's reason (strerror) why writing and syncing `size` bytes in `directory` fails; None if it works."""
    probe = directory / ".grpo-write-probe"
    try:
        with probe.open("wb") as fh:
            fh.write(bytes(size))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        return e.strerror or str(e)
    finally:
        probe.unlink(missing_ok=True)
    return None


def write_failure_reason(error: Exception, directory: Path) -> str:
    """Why a write into `directory` failed, as the OS says it ("No space left on device").

    An OSError carries it; safetensors puts "(os error N)" in its message; torch.save loses the errno
    ("unexpected pos 576 vs 534"), so a probe write into the same directory recovers it. Otherwise the
    exception's type and first line.
    """
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    found = OS_ERROR_RE.search(str(error))
    if found:
        return os.strerror(int(found.group(1)))
    probed = probe_write(directory) if directory.is_dir() else None
    if probed:
        return probed
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def umask_file_mode(directory: Path) -> int:
    """The permission bits a new file in `directory` gets (0o666 minus the umask, e.g. 0o644)."""
    probe = directory / ".grpo-mode-probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return os.fstat(fd).st_mode & 0o777
    finally:
        os.close(fd)
        probe.unlink()


def apply_umask_mode(directory: Path) -> None:
    """Give every file under `directory` the mode of a new file, so all files of a checkpoint or an export
    are readable alike (safetensors writes a 0600 temporary and renames it: its files come out 0600)."""
    mode = umask_file_mode(directory)
    for p in directory.rglob("*"):
        if p.is_file() and p.stat().st_mode & 0o777 != mode:
            os.chmod(p, mode)


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


def cuda_rng_state() -> torch.Tensor | None:
    """The current CUDA device's generator state, or None where CUDA was never initialised (a CPU run does not
    initialise it to save this; each process restores its own device's state, whatever the GPU count)."""
    return accelerator("cuda").get_rng_state()


def rng_state(sample_generator: torch.Generator | None = None, stream_state: Any = None) -> dict[str, Any]:
    """Every random state a resumed run needs, as tensors and plain values (loads with weights_only)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "torch": torch.get_rng_state(),
            "cuda": cuda_rng_state(),
            "sampler": None if sample_generator is None else sample_generator.get_state(),
            "stream": stream_state}


def restore_rng(state: dict[str, Any], sample_generator: torch.Generator | None = None) -> None:
    """Set the generators saved by :func:`rng_state` (the stream state is restored by PromptStream)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    gpu = accelerator("cuda")
    if isinstance(cuda, list):            # checkpoints before 2026-11-27: one state per visible GPU
        index = gpu.current_device().index if cuda and gpu.is_available() else None
        cuda = cuda[index] if index is not None and index < len(cuda) else None
    if isinstance(cuda, torch.Tensor) and gpu.is_available():
        gpu.set_rng_state(cuda)
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
    check_manifest_complete(path, set(files))
    return manifest


def check_manifest_complete(path: Path, listed: set[str]) -> None:
    """CheckpointError unless the manifest lists every file of the checkpoint (hidden names aside) and
    the files every checkpoint needs: trainer_state.json, the model config and the policy weights."""
    present = sorted(rel for p in path.rglob("*") if p.is_file()
                     and (rel := p.relative_to(path).as_posix()) != MANIFEST
                     and not any(part.startswith(".") for part in p.relative_to(path).parts))
    unlisted = [rel for rel in present if rel not in listed]
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        raise CheckpointError(f"{path.name}: {unlisted[0]}{more} is not listed in {MANIFEST} (a partial manifest: "
                              f"the file cannot be verified)")
    for what, names in REQUIRED_FILES:
        if not listed & set(names):
            raise CheckpointError(f"{path.name}: {MANIFEST} lists no {what} ({' or '.join(names)})")


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
    try:
        os.replace(tmp, final)
    except OSError:
        if old.exists() and not final.exists():
            os.replace(old, final)                 # the replaced checkpoint goes back in place
        raise
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


def _write_files(tmp: Path, step: int, model, tokenizer, optimizer, scheduler, state, rng, reference,
                 extra_files=()) -> None:
    from grpo.state.model_files import save_checkpoint_model
    from safetensors.torch import save_model

    with _writing(tmp):
        save_checkpoint_model(model, tokenizer, tmp)   # LoRA: only the adapter (it names its base model)
    emit("save", step)
    if optimizer is not None:
        with _writing(tmp / "optimizer.pt"):
            scaler = getattr(optimizer, "grpo_loss_scaler", None)     # fp16: the loss scale and its growth count
            torch.save({"optimizer": optimizer.state_dict(),
                        "scheduler": None if scheduler is None else scheduler.state_dict(),
                        "loss_scaler": scaler.state_dict() if scaler is not None else None}, tmp / "optimizer.pt")
    if rng is not None:
        with _writing(tmp / "rng_state.pt"):
            torch.save(rng, tmp / "rng_state.pt")
    if reference is not None:
        with _writing(tmp / "reference.safetensors"):
            save_model(reference, str(tmp / "reference.safetensors"))
    for write in extra_files:                     # writers of the run's other state (TrainState.extras)
        with _writing(tmp):
            write(tmp)
    with _writing(tmp / "trainer_state.json"):
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=1, default=str))
    with _writing(tmp / MANIFEST):
        apply_umask_mode(tmp)                      # one mode for every file (safetensors writes 0600)
        write_manifest(tmp, step)


def _write_error_message(error: BaseException, final: Path, directory: Path) -> str | None:
    """The one line for a failed write of checkpoint `final` (None: not an I/O failure, re-raise it).

    Called while the failed files still exist, so a probe write sees the disk as full as it was. The
    failed frames' locals are cleared first: torch.save leaves its file open there, and that file's
    space is only freed when it closes.
    """
    if not isinstance(error, (_FileWriteFailed, OSError)):
        return None
    cause = error.cause if isinstance(error, _FileWriteFailed) else error
    traceback.clear_frames(error.__traceback__)
    traceback.clear_frames(cause.__traceback__)
    where = getattr(cause, "filename", None) or (error.path if isinstance(error, _FileWriteFailed) else directory)
    return (f"writing checkpoint {final} failed: {write_failure_reason(cause, directory)} ({where}); "
            f"earlier checkpoints are intact")


def save_checkpoint(output_dir: str | Path, step: int, model, tokenizer, *, optimizer=None, scheduler=None,
                    state: dict[str, Any] | None = None, rng: dict[str, Any] | None = None,
                    reference: torch.nn.Module | None = None, save_total_limit: int = 0, extra_files=()) -> Path:
    """Write `output_dir/checkpoint-<step>` atomically; keep the newest `save_total_limit` (0 = all).

    `reference` (a module) is stored as reference.safetensors; each of `extra_files` (a function of the
    temporary directory) writes more files before the manifest. On any failure the temporary
    directory is removed; an I/O failure (an OSError, or torch's / safetensors' RuntimeError on a full
    disk) becomes a one-line CheckpointWriteError naming the file and the reason.
    """
    out = Path(output_dir)
    final, tmp = out / f"checkpoint-{step}", out / f".checkpoint-{step}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _write_files(tmp, step, model, tokenizer, optimizer, scheduler, state, rng, reference, extra_files)
        _publish(tmp, final)
    except BaseException as e:
        message = _write_error_message(e, final, tmp if tmp.is_dir() else out)   # before the temporary goes
        shutil.rmtree(tmp, ignore_errors=True)
        if message is None:
            raise
        raise CheckpointWriteError(message) from (e.cause if isinstance(e, _FileWriteFailed) else e)
    prune_checkpoints(out, save_total_limit, step)
    return final
