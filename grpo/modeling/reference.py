"""The reference policy pi_ref of the KL term: none, a frozen copy, or the LoRA base model.

* ``beta == 0``: no reference at all (nothing is copied, no extra forward pass).
* full fine-tuning: a frozen deep copy of the initial policy.
* LoRA: the policy itself with its adapters disabled, so no second copy is held in memory.
* full fine-tuning with ``train.ref_offload`` disk | cpu: the frozen copy's weights live in a file or in host
  memory and are loaded for the reference pass only (grpo/modeling/offload.py).

Iterative GRPO (DeepSeekMath, section 4.2) refreshes the reference during training; with
``algorithm.ref_update_steps = N`` every N steps the copy becomes the mix
``ref <- alpha * policy + (1 - alpha) * ref`` (``alpha = algorithm.ref_mix_alpha``; 1 = copy).
"""

from __future__ import annotations

import contextlib
import copy

import torch

from grpo.modeling.logprobs import fixed_logprobs
from grpo.modeling.offload import Offloaded, hollow_copy, sources_by_name
from grpo.modeling.precision import store_frozen_linears


@torch.no_grad()
def mix_parameters(ref: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """In place: theta_ref <- alpha * theta_policy + (1 - alpha) * theta_ref, parameter by parameter."""
    ref_params, pol_params = dict(ref.named_parameters()), dict(policy.named_parameters())
    if ref_params.keys() != pol_params.keys():
        raise ValueError("mix_parameters: the reference and the policy have different parameters")
    for name, p_ref in ref_params.items():
        p_ref.lerp_(pol_params[name].to(p_ref.dtype), alpha)


class FrozenCopy:
    """pi_ref = a frozen copy of the initial policy (full fine-tuning).

    `offload` (`train.ref_offload` as the runtime resolved it): disk | cpu keep the copy's weights in a file or in
    host memory between reference passes and load them for each pass only (grpo/modeling/offload.py): the same
    log-probs, bit for bit, without the copy in memory through the rollout and the update. Such a copy is built
    hollow and its store filled from the policy's weights one tensor at a time, so the device never holds two
    sets of weights (a plain deep copy would, until offloaded: a GPU run that needs the offload to fit would
    fail before its first step)."""

    def __init__(self, policy: torch.nn.Module, storage_dtype: torch.dtype | None = None, offload: str = "none",
                 offload_dir: str | None = None):
        if offload == "none":
            self.model, originals = copy.deepcopy(policy), None
        else:                                   # the weights go from the policy straight to the store
            self.model, originals = hollow_copy(policy)
        self.model.eval().requires_grad_(False)
        if storage_dtype is not None:           # train.precision bf16/fp16: linears kept in autocast's dtype
            store_frozen_linears(self.model, storage_dtype)
        self.offloaded = None if originals is None else Offloaded(
            self.model, offload, offload_dir, sources=sources_by_name(self.model, originals))

    def logprobs(self, input_ids, attention_mask, completion_length, temperature, micro_batch_size=0, max_tokens=0,
                 model_inputs=None, host=None):
        """Shape: [N, P + T] -> [N, T]. `host`: the rows on the CPU (grpo.types.HostView; None: copied)."""
        with self.offloaded.resident() if self.offloaded is not None else contextlib.nullcontext():
            return fixed_logprobs(self.model, input_ids, attention_mask, completion_length, temperature,
                                  micro_batch_size, max_tokens=max_tokens, model_inputs=model_inputs,
                                  host=host)

    def refresh(self, policy: torch.nn.Module, alpha: float) -> None:
        if self.offloaded is not None:
            raise ValueError("algorithm.ref_update_steps needs a reference held in memory: set train.ref_offload none")
        mix_parameters(self.model, policy, alpha)


class AdapterDisabled:
    """pi_ref = the LoRA policy with its adapters switched off (the frozen base weights)."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy

    def logprobs(self, input_ids, attention_mask, completion_length, temperature, micro_batch_size=0, max_tokens=0,
                 model_inputs=None, host=None):
        """Shape: [N, P + T] -> [N, T]. `host`: the rows on the CPU (grpo.types.HostView; None: copied)."""
        with self.policy.disable_adapter():
            return fixed_logprobs(self.policy, input_ids, attention_mask, completion_length, temperature,
                                  micro_batch_size, max_tokens=max_tokens, model_inputs=model_inputs,
                                  host=host)

    def refresh(self, policy: torch.nn.Module, alpha: float) -> None:
        raise ValueError("algorithm.ref_update_steps needs full fine-tuning: with LoRA the reference is "
                         "the base model (adapters disabled)")


def build_reference(policy: torch.nn.Module, beta: float, storage_dtype: torch.dtype | None = None,
                    offload: str = "none", offload_dir: str | None = None):
    """The reference for a policy: None when beta == 0, else AdapterDisabled (LoRA) or FrozenCopy, whose weights
    wait in a file or host memory between passes when `offload` (`train.ref_offload` as the runtime resolved it) is
    disk | cpu; `offload_dir`: where the disk store's unnamed file goes (None = the system's temporary directory).

    `storage_dtype` (the autocast dtype of train.precision, for a reference that is never refreshed): the
    copy's linear weights are stored in it (grpo.modeling.precision.store_frozen_linears), the values autocast
    would compute with anyway, so the reference costs half the memory for them."""
    if beta <= 0:
        return None
    from grpo.modeling.lora import is_lora

    return AdapterDisabled(policy) if is_lora(policy) else FrozenCopy(policy, storage_dtype, offload, offload_dir)
