"""Export of a checkpoint to one plain merged model (``grpo export``).

:func:`export_merged` turns a checkpoint (full model or LoRA adapter, grpo.state.model_files) into a
directory that plain ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads, with the adapter merged
into the base weights (``merge_and_unload``), plus the tokenizer.  Other files of a training checkpoint
(optimizer and RNG state, trainer_state.json) are not copied.  A training checkpoint is verified
against its manifest first (a corrupted file is an error naming it); every exported file gets the
mode the umask gives a new file.
"""

from __future__ import annotations

from pathlib import Path

from grpo.state.checkpoint import MANIFEST, CheckpointError, apply_umask_mode, verify_checkpoint
from grpo.state.model_files import load_checkpoint


def verify_export_source(checkpoint_dir: str | Path) -> None:
    """A training checkpoint (it has a manifest.json or a trainer_state.json) must match its manifest;
    CheckpointError naming the directory and the file otherwise. A plain model directory has none to check."""
    directory = Path(checkpoint_dir)
    if (directory / MANIFEST).is_file() or (directory / "trainer_state.json").is_file():
        try:
            verify_checkpoint(directory)
        except CheckpointError as e:
            raise CheckpointError(f"cannot export {directory}: {e}") from None


def export_merged(checkpoint_dir: str | Path, out_dir: str | Path, dtype: str | None = None) -> Path:
    """Write the checkpoint's policy as one full model (+ tokenizer) to ``out_dir``; returns it.

    ``out_dir`` must not exist or be empty.  The result loads with plain
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` and computes the trained policy.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"export directory is not empty: {out}")
    verify_export_source(checkpoint_dir)
    model, tokenizer = load_checkpoint(checkpoint_dir, dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    apply_umask_mode(out)                          # safetensors writes 0600; the tokenizer files 0644
    return out
