"""Moving the policy's weights into a vLLM server (grpo/rollout/engines/vllm_server.py), both ends.

The weights go in Hugging Face checkpoint form: the names and shapes of the model directory the server loaded
(``model.layers.0.self_attn.q_proj.weight``), a LoRA policy's adapters merged into its base weights
(:func:`merged_state`), and vLLM's own loader (``model.load_weights``) maps them onto its fused layers.

Two transports, by the trainer's device:

- **CUDA: NCCL weight transfer** (:class:`NcclWeights`): vLLM's ``nccl`` weight-transfer backend (the server
  started with ``--weight-transfer-config {"backend": "nccl"}``, which ``grpo vllm-serve`` passes on a CUDA
  machine) and its trainer side, ``NCCLTrainerWeightTransferEngine``, over the server's HTTP routes
  ``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``.
- **CPU (and CUDA without it): a safetensors file** (:class:`FileWeights`): the trainer writes the weights to
  one file in a directory of its machine's temporary space (``TMPDIR``) and asks the server, through vLLM's
  dev-mode ``/collective_rpc``, to run :meth:`GrpoWorkerExtension.grpo_load_weights` in its workers: vLLM's
  in-place ``reload_weights`` over that file. None of vLLM's weight-transfer backends runs on CPU (nccl,
  sparse_nccl, nccl_m2n and ipc are CUDA's, sharded_rdt needs Ray and NIXL); the server must see the
  trainer's file system (the same machine, or a shared TMPDIR).

:class:`GrpoWorkerExtension` is the server's side (``grpo vllm-serve`` passes it as vLLM's
``--worker-extension-cls``). Besides the load it re-packs the CPU backend's copies of embedding-shaped
weights: vLLM's in-place reload leaves the LM head of a model with tied embeddings (the embedded policy's)
multiplying by the packed copy of the old embedding on CPU (measured: log-probs of the old head after a
reload), while the embedding itself is new.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

#: vLLM's --worker-extension-cls for a `grpo vllm-serve` server.
EXTENSION = "grpo.rollout.engines.vllm_transport.GrpoWorkerExtension"

#: Name parts a wrapper adds to a policy's parameter names and the checkpoint does not have.
WRAPPER_PARTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
PEFT_PREFIX = "base_model.model."


def _lora_weight(layer: torch.nn.Module, base: torch.Tensor) -> torch.Tensor:
    """A peft LoRA layer's weight with its active adapters merged in (the layer itself is not changed)."""
    if getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return base
    weight = base
    for adapter in layer.active_adapters:
        known = adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {})
        if known:
            if getattr(layer, "use_dora", {}).get(adapter):
                raise NotImplementedError("a DoRA adapter cannot be merged for the vLLM server (plain LoRA only)")
            weight = weight + layer.get_delta_weight(adapter).to(base.dtype)
    return weight


def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded (FSDP2 DTensor) tensor gathered whole (a collective: every rank calls it); others as they are."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def merged_state(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights as its checkpoint names them: peft prefixes and wrappers' name parts dropped, LoRA
    adapters merged into their base weights (W + scale * B A), adapter matrices left out, a tied weight once
    (under its first name, the embedding's, as Hugging Face writes it). Tensors are detached, on their device."""
    model = getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model
    modules = dict(model.named_modules())
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if ".lora_" in name or ".original_module." in name:
            continue                                   # adapter matrices; the frozen copy of a modules_to_save
        owner, _, leaf = name.rpartition(".")
        if owner.endswith(".base_layer") and leaf == "weight" and hasattr(modules.get(owner[:-11]), "lora_A"):
            tensor = _lora_weight(modules[owner[:-11]], _full(tensor.detach()))
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen and tensor.data_ptr():
            continue                                   # tied (lm_head = embed_tokens)
        seen.add(key)
        for part in WRAPPER_PARTS:
            name = name.replace(part, "")
        name = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
        if ".modules_to_save." in name:                # peft's trained copy of a whole module: its own name
            head, _, rest = name.partition(".modules_to_save.")
            name = f"{head}.{rest.partition('.')[2]}"
        yield name, _full(tensor.detach())


def sharded(model: torch.nn.Module) -> bool:
    """True when the policy's parameters are FSDP2 shards: every rank then walks :func:`merged_state` (its
    gathers are collectives) while rank 0 alone sends."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


class FileWeights:
    """The weights through one safetensors file the server's workers load in place (module docstring)."""

    name = "safetensors file + collective_rpc reload_weights"

    def __init__(self, rpc: Callable[[str, list], Any]):
        self.rpc = rpc
        self.directory = Path(tempfile.mkdtemp(prefix="grpo-vllm-weights-"))
        self.path = self.directory / "model.safetensors"

    def push(self, model: torch.nn.Module) -> None:
        from safetensors.torch import save_file

        tensors = {name: t.to("cpu").contiguous() for name, t in merged_state(model)}
        partial = self.directory / "model.safetensors.partial"
        save_file(tensors, str(partial), metadata={"format": "pt"})
        os.replace(partial, self.path)
        del tensors
        self.rpc("grpo_load_weights", [str(self.path)])

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _source(model: torch.nn.Module):
    """vLLM's WeightSource over :func:`merged_state` (names, dtypes and shapes declared once: they never change)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class MergedSource(WeightSource):
        def __init__(self):
            self.model = model
            self.meta = [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in merged_state(model)]

        def metadata(self):
            return self.meta

        def __iter__(self):
            return ((n, t.contiguous()) for n, t in merged_state(self.model))

    return MergedSource()


class NcclWeights:
    """The weights over NCCL with vLLM's trainer-side engine (CUDA; the server's ``nccl`` backend)."""

    name = "NCCL weight transfer"

    def __init__(self, post: Callable[[str, dict | None], Any], server_host: str, world_size: int,
                 model: torch.nn.Module, device: torch.device):
        from vllm.distributed.weight_transfer.nccl_engine import (NCCLTrainerInitInfo,
                                                                   NCCLTrainerWeightTransferEngine)

        torch.cuda.set_device(device)
        source = _source(model)
        info = NCCLTrainerInitInfo(master_address=_address_towards(server_host), master_port=_free_port(),
                                   world_size=world_size + 1, rank=0)
        self.post = post
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=_RouteClient(post), source=source)

    def push(self, model: torch.nn.Module) -> None:
        self.engine.source.model = model
        self.engine.send_weights()

    def close(self) -> None:
        try:
            self.post("/shutdown_weight_transfer_engine", None)
        finally:
            self.engine.shutdown()


class _RouteClient:
    """vLLM's VLLMWeightSyncClient protocol over the server's weight-transfer routes."""

    def __init__(self, post: Callable[[str, dict | None], Any]):
        self.post = post

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.post("/start_weight_update", None)

    def update_weights(self, update_info) -> None:
        self.post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.post("/finish_weight_update", None if weight_version is None else {"weight_version": weight_version})


def _address_towards(host: str) -> str:
    """This machine's address on the route to `host` (what the server's workers connect back to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))      # UDP: nothing is sent
        return s.getsockname()[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class GrpoWorkerExtension:
    """Mixed into the server's vLLM workers by ``grpo vllm-serve`` (vLLM's --worker-extension-cls); its methods
    are what the trainer calls through ``/collective_rpc``."""

    def grpo_info(self) -> dict:
        """What the trainer checks at start: the log-probs vLLM returns and the weight transports it offers."""
        cfg = self.vllm_config
        transfer = getattr(cfg, "weight_transfer_config", None)
        return {"logprobs_mode": cfg.model_config.logprobs_mode,
                "weight_transfer": getattr(transfer, "backend", None), "device": str(self.device)}

    def grpo_load_weights(self, path: str) -> int:
        """Load a safetensors file of checkpoint-named weights in place (vLLM's reload_weights); the number read."""
        from safetensors import safe_open

        count = 0

        def weights():
            nonlocal count
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    count += 1
                    yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)
        model = self.model_runner.get_model()
        for module in model.modules():                 # the CPU backend's packed copies (module docstring)
            method = getattr(module, "quant_method", None)
            weight = getattr(module, "weight", None)
            if type(method).__name__ == "UnquantizedEmbeddingMethod" and weight is not None and weight.numel():
                method.process_weights_after_loading(module)
        return count
