"""The policy files of a checkpoint: saving the policy (full model, or LoRA adapter naming its base)
with its tokenizer, and loading either back as one plain transformers model.

A checkpoint directory holds the tokenizer and either

* a full model (``config.json`` + weights, ``save_pretrained`` of a transformers model), or
* a peft LoRA adapter (``adapter_config.json`` + adapter weights); ``adapter_config.json`` names
  the base model directory as ``base_model_name_or_path`` (see :mod:`grpo.modeling.lora`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from grpo.modeling.lora import base_model_path, is_lora
from grpo.modeling.models import DTYPES, TOKENIZER_FILES, check_model_dir, load_policy, load_tokenizer

ADAPTER_CONFIG = "adapter_config.json"


def _is_model_dir(path: str | Path | None) -> bool:
    """True when ``path`` is a local directory with a ``config.json``."""
    return bool(path) and (Path(path) / "config.json").is_file()


def save_checkpoint_model(model: torch.nn.Module, tokenizer, path: str | Path) -> Path:
    """Save the policy and its tokenizer to ``path`` in Hugging Face format; returns ``path``.

    A full model is saved whole.  A LoRA model saves only its adapter (``adapter_config.json``
    records the base model directory) -- unless that base directory is unknown or gone (e.g. a
    model built in memory), in which case a merged deep copy is saved as a full model so the
    checkpoint stays loadable on its own; the live model is never modified.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if is_lora(model) and not _is_model_dir(base_model_path(model)):
        copy.deepcopy(model).merge_and_unload().save_pretrained(path)
    else:
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def checkpoint_kind(checkpoint_dir: str | Path) -> str:
    """``"adapter"`` or ``"full"``; one-line ``FileNotFoundError`` / ``ValueError`` otherwise."""
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {directory}")
    if (directory / ADAPTER_CONFIG).is_file():
        return "adapter"
    if (directory / "config.json").is_file():
        return "full"
    raise ValueError(f"not a model checkpoint (no config.json or {ADAPTER_CONFIG}): {directory}")


def adapter_base_dir(checkpoint_dir: str | Path) -> Path:
    """The base model directory recorded in an adapter checkpoint's ``adapter_config.json``."""
    config_file = Path(checkpoint_dir) / ADAPTER_CONFIG
    base = json.loads(config_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config_file} does not name its base model (base_model_name_or_path)")
    if not _is_model_dir(base):
        raise FileNotFoundError(f"base model directory {base} named in {config_file} not found "
                                "(or has no config.json)")
    return check_model_dir(base)


def stored_dtype(model_dir: str | Path) -> str:
    """The parameter dtype recorded in ``config.json`` (``dtype`` / ``torch_dtype``); float32 if unknown."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype")
    return name if name in DTYPES else "float32"


def load_checkpoint(checkpoint_dir: str | Path, dtype: str | None = None):
    """``(model, tokenizer)`` of a checkpoint, adapters merged into a plain transformers model.

    ``dtype`` defaults to the dtype stored with the (base) model.  The tokenizer is the
    checkpoint's own, or the base model's when an adapter checkpoint has none.
    """
    directory = Path(checkpoint_dir)
    try:
        return _load_checkpoint(directory, dtype)
    except (ValueError, OSError):
        raise                                          # already one line naming the file
    except Exception as e:                             # SafetensorError (truncated weights), a torch unpickling error...
        first = (str(e).strip().splitlines() or [""])[0]
        files = sorted(p.name for p in directory.iterdir() if p.suffix in (".safetensors", ".bin"))
        raise ValueError(f"cannot load the model in {directory}: its weights ({', '.join(files) or 'none found'}) "
                         f"are unreadable ({type(e).__name__}: {first})") from e


def _load_checkpoint(directory: Path, dtype: str | None):
    if checkpoint_kind(directory) == "full":
        return load_policy(directory, dtype or stored_dtype(directory))
    from peft import PeftModel

    from grpo.modeling.lora import quiet_peft

    base_dir = adapter_base_dir(directory)
    base, tokenizer = load_policy(base_dir, dtype or stored_dtype(base_dir))
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = load_tokenizer(directory)
    with quiet_peft():
        merged = PeftModel.from_pretrained(base, str(directory)).merge_and_unload()
    return merged.eval(), tokenizer
