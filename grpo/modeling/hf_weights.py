"""The policy's weights as a Hugging Face checkpoint would name them: what a generation engine loads
(grpo/rollout/engines/vllm_*.py). A LoRA policy gives merged weights, W + (alpha / r) B A per adapted layer,
computed beside the model: the live model (and its float32 base weights) is never modified."""

from __future__ import annotations

from typing import Iterator

import torch


def _lora_deltas(base: torch.nn.Module) -> dict[str, torch.Tensor]:
    """module name -> the summed delta of its active, unmerged adapters (peft LoRA layers)."""
    deltas = {}
    for name, module in base.named_modules():
        if not hasattr(module, "get_delta_weight") or not hasattr(module, "base_layer"):
            continue
        active = [a for a in getattr(module, "active_adapters", []) if a in getattr(module, "lora_A", {})]
        if active and not getattr(module, "merged", False):
            deltas[name] = sum(module.get_delta_weight(a) for a in active)
    return deltas


@torch.no_grad()
def hf_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of every parameter of the policy, LoRA merged; tied weights once."""
    if not hasattr(model, "peft_config"):
        yield from ((n, p.detach()) for n, p in model.named_parameters())
        return
    base = model.get_base_model()
    deltas = _lora_deltas(base)
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue                                            # the adapters themselves: merged below
        module, _, leaf = name.rpartition(".")
        if module.endswith(".base_layer"):
            owner = module[: -len(".base_layer")]
            weight = p.detach()
            if leaf == "weight" and owner in deltas:
                weight = weight + deltas[owner].to(weight.dtype)
            yield f"{owner}.{leaf}", weight
        else:
            yield name, p.detach()
