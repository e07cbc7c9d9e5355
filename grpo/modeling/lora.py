"""LoRA adapters through peft, and the adapter-disabled reference policy.

With LoRA the policy is ``W x + (alpha / r) * B A x`` with only ``A`` and ``B`` trainable.  The
reference policy pi_ref of the KL term is the same model with its adapters switched off (peft's
``disable_adapter()``), so no second copy of the weights is kept in memory::

    model, tokenizer = load_policy(path)            # model.name_or_path = absolute base directory
    model = apply_lora(model, cfg.lora)             # PeftModel; base frozen
    with reference_context(model) as ref:           # adapters off inside the block
        ref_logps = fixed_logprobs(ref, ...)

``apply_lora`` must receive the model as :func:`grpo.modeling.models.load_policy` returns it (its
``name_or_path`` is the absolute directory of the base model), or be given ``base_path``: that
path is written to ``adapter_config.json`` as ``base_model_name_or_path`` when the adapter is
saved, and :func:`grpo.state.export.export_merged` loads the base model from it.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import torch

from grpo.config import LoraConfig

#: ``lora.target_modules`` value meaning "every linear layer except the output head" (peft).
ALL_LINEAR = "all-linear"
#: ``lora.target_modules`` value meaning "peft's default modules for the model's type" (what get_peft_model picks
#: for ``target_modules=None``; q_proj and v_proj for Llama / Qwen2): TRL's ``use_peft`` without
#: ``lora_target_modules``.
PEFT_DEFAULT = "peft-default"
#: A single ``lora.target_modules`` entry holding one of these is a regular expression that must match a
#: module's full name (peft's string form); plain names, dotted ones too (self_attn.q_proj), match a module
#: name's last parts.
REGEX_CHARS = frozenset("*+?[](){}|^$\\")


def peft_lora_config(cfg: LoraConfig, fan_in_fan_out: bool = False):
    """The peft ``LoraConfig`` for a causal LM described by our ``lora`` config section.

    ``fan_in_fan_out`` is True for models whose linear layers store ``[in, out]`` weights
    (GPT-2's ``Conv1D``).
    """
    from peft import LoraConfig as PeftLoraConfig   # peft (and accelerate) load only for LoRA runs: ~100 MiB

    targets = list(cfg.target_modules)
    if targets == [PEFT_DEFAULT]:
        targets = None                        # peft picks its default for the model type
    elif len(targets) == 1 and (targets[0] == ALL_LINEAR or set(targets[0]) & REGEX_CHARS):
        targets = targets[0]                  # peft's string form: all-linear, or a regex on the full name
    return PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        bias="none",
        fan_in_fan_out=fan_in_fan_out,
        task_type="CAUSAL_LM",
    )


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, base_path: str | Path | None = None) -> PeftModel:
    """Wrap ``model`` (modified in place) with fresh LoRA adapters; only adapter weights are trainable.

    At initialisation B = 0, so the wrapped model computes exactly the base model's function.
    ``base_path`` (default: ``model.name_or_path``) is recorded as the adapter's base model.
    The adapter weights are created on the model's device, whatever torch's default device is.
    Raises ``ValueError`` (one line) when no module matches ``cfg.target_modules``.
    """
    from peft import get_peft_model
    from transformers.pytorch_utils import Conv1D

    from grpo.modeling.models import model_device

    if is_lora(model):
        raise ValueError("the model already has LoRA adapters")
    conv1d = any(isinstance(m, Conv1D) for m in model.modules())
    try:
        with torch.device(model_device(model)), quiet_peft():  # peft makes the A/B layers on the default device
            peft_model = get_peft_model(model, peft_lora_config(cfg, fan_in_fan_out=conv1d))
    except ValueError as e:  # e.g. target modules not found in the model
        raise ValueError(f"lora.target_modules {list(cfg.target_modules)}: {str(e).splitlines()[0]}") from None
    if base_path is not None:
        peft_model.peft_config[peft_model.active_adapter].base_model_name_or_path = str(Path(base_path).resolve())
    return peft_model


@contextlib.contextmanager
def quiet_peft():
    """Hides one FutureWarning that peft triggers on transformers 5.2x: ``PeftModel.__init__`` reads the
    deprecated ``is_gradient_checkpointing`` property, so every LoRA run printed the warning on stderr
    (before a one-line error, say). Other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def is_lora(model: torch.nn.Module) -> bool:
    """True for a peft model (the policy trains adapters, the reference is the adapter-free model).
    Without peft imported no model can be one, and the check does not import it."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def base_model_path(model: PeftModel) -> str | None:
    """The base model directory an adapter of ``model`` would record (``None`` when unknown)."""
    recorded = model.peft_config[model.active_adapter].base_model_name_or_path
    return recorded or model.get_base_model().__dict__.get("name_or_path") or None


def trainable_parameter_names(model: torch.nn.Module) -> list[str]:
    """Names of the parameters with ``requires_grad`` (the LoRA A/B matrices under LoRA)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]
