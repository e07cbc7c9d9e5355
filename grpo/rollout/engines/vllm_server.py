"""The vLLM server engine (``rollout.engine: vllm``, ``rollout.vllm.mode: server``; TRL's ``vllm_mode: server``):
generation in a ``grpo vllm-serve`` process (grpo/cli/vllm_serve.py), over HTTP.

    prompt token ids -> one POST /v1/completions per prompt (token-id prompt, n, the prompt's seed, stop ids)
        -> the completions' token ids and the sampled tokens' log-probs -> Generation

- **No re-tokenisation**: prompts go as token ids, completions come back as token ids (``return_token_ids``).
- **Log-probs**: the server runs with ``--logprobs-mode processed_logprobs`` (``grpo vllm-serve`` sets it; checked
  at start), so a token's log-prob is the one under the distribution it was drawn from, after temperature and
  top-k / top-p / min-p, as the native sampler's.
- **Seeds**: each prompt's request carries its own seed (grpo/rollout/params.py's ``prompt_seeds``); vLLM gives
  completion j of it seed + j, so a prompt group repeats under the same run seed in any batch.
- **Stops**: exactly ``stop_token_ids`` (``ignore_eos``: the server adds no EOS of its own); the stop id stays in.
- **Weights**: ``sync_weights`` pushes the whole policy after every update (checkpoint names; a LoRA policy
  merged), then resets the server's prefix cache. Transport by the trainer's device (grpo/rollout/engines/
  vllm_transport.py): **CUDA: NCCL weight transfer** (vLLM's ``nccl`` backend and its trainer-side engine;
  needs vLLM importable in the trainer too); **CPU: a safetensors file** in the trainer's temporary directory
  that the server's workers load in place (vLLM's ``reload_weights`` through its dev-mode ``/collective_rpc``),
  verified on CPU, so the server must see that directory (the same machine, or a shared TMPDIR).
- **Failures**: every request is retried while the server cannot be reached, up to ``rollout.vllm.server_timeout``
  seconds; then, and for a server serving another model or not started by ``grpo vllm-serve``, one line naming
  the URL (:class:`VllmServerError`).

Under torchrun every rank generates through the server; rank 0 alone pushes weights, then all ranks wait for it.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from grpo.rollout.engine import EngineUnavailable, vllm_importable
from grpo.rollout.engines.turns import play_turns
from grpo.rollout.engines.vllm_transport import FileWeights, NcclWeights
from grpo.rollout.params import Prompts, SamplingParams, prompt_seeds
from grpo.types import Generation

#: Statuses of a server (or a proxy before it) that is starting or overloaded: retried like a refused connection.
RETRY_STATUSES = (502, 503, 504)
#: Requests in flight at once (one per prompt).
MAX_CONCURRENT = 64


class VllmServerError(EngineUnavailable, ConnectionError):
    """The vLLM server cannot serve this run; one line naming the URL and what to do (an OSError, so the CLI
    prints it as such)."""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _why(error: BaseException) -> str:
    """'connection refused', 'connection reset', ... from a urllib / socket error."""
    reason = getattr(error, "reason", error)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)):
        return "connection reset"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    return _one_line(reason, 120) or type(reason).__name__


class Http:
    """JSON over HTTP to one server: a request is retried while the server cannot be reached (refused, reset,
    502-504) up to `timeout` seconds, and may take that long to answer."""

    def __init__(self, url: str, timeout: float, command: str):
        self.url, self.timeout, self.command = url, timeout, command
        self.answered = False            # once the server answered, a failure reads "stopped answering"

    def call(self, path: str, body: Any = None, method: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method or ("GET" if body is None
                                                                                       else "POST"),
                                         headers={"Content-Type": "application/json"})
        start = time.monotonic()
        while True:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                self.answered = True
                return json.loads(raw) if raw.strip() else None
            except urllib.error.HTTPError as e:
                if e.code not in RETRY_STATUSES:
                    self.answered = True
                    verb = "failed on" if e.code >= 500 else "refused"
                    raise StatusError(e.code, f"the vLLM server at {self.url} {verb} {path} (HTTP {e.code}: "
                                      f"{_detail(e)})") from None
                why = f"HTTP {e.code}"
            except (TimeoutError, socket.timeout):
                raise VllmServerError(f"the vLLM server at {self.url} gave no answer to {path} within "
                                      f"{self.timeout:.0f} s (rollout.vllm.server_timeout)") from None
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as e:
                if isinstance(getattr(e, "reason", None), (TimeoutError, socket.timeout)):
                    raise VllmServerError(f"the vLLM server at {self.url} gave no answer to {path} within "
                                          f"{self.timeout:.0f} s (rollout.vllm.server_timeout)") from None
                why = _why(e)
            waited = time.monotonic() - start
            if waited >= self.timeout:
                raise self.down(why, waited)
            time.sleep(min(1.0, self.timeout - waited))

    def down(self, why: str, waited: float) -> VllmServerError:
        if self.answered:
            return VllmServerError(f"the vLLM server at {self.url} stopped answering ({why}, retried for "
                                   f"{waited:.0f} s): restart it with {self.command} and resume the run (--resume)")
        return VllmServerError(f"the vLLM server at {self.url} is unreachable ({why} after {waited:.0f} s): "
                               f"start it with {self.command}")


class StatusError(VllmServerError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read() or b"{}")
    except (ValueError, OSError):
        return error.reason or ""
    inner = body.get("error", body) if isinstance(body, dict) else body
    message = inner.get("message") or inner.get("detail") if isinstance(inner, dict) else inner
    return _one_line(message or body)


def _names(model: str) -> set[str]:
    """What identifies a model path or hub id: itself, its resolved local directory, its last part (a hub id's
    name, a directory's name), and the hub id of a Hugging Face cache directory (models--org--name)."""
    model = model.rstrip("/")
    names = {model, model.rsplit("/", 1)[-1].lower()}
    path = Path(model).expanduser()
    if path.exists():
        names.add(str(path.resolve()))
    for part in path.parts:
        if part.startswith("models--"):
            hub = part[len("models--"):].replace("--", "/")
            names |= {hub, hub.rsplit("/", 1)[-1].lower()}
    return names


class ServerEngine:
    """Generation in a `grpo vllm-serve` server (module docstring)."""

    name = "vllm"

    def __init__(self, url: str, timeout: float, model_name: str, pad_token_id: int, device: torch.device):
        self.model_name, self.pad_token_id, self.device = model_name, pad_token_id, torch.device(device)
        port = urllib.parse.urlsplit(url).port
        self.http = Http(url.rstrip("/"), timeout, f"`grpo vllm-serve --model {model_name}"
                                                   f"{f' --port {port}' if port and port != 8000 else ''}`")
        self.url = self.http.url
        self.transport = None
        self.pool = None
        import torch.distributed as dist

        self.distributed = dist.is_available() and dist.is_initialized()
        self.main = not self.distributed or dist.get_rank() == 0

    def connect(self, model: torch.nn.Module) -> None:
        """Wait for the server (up to server_timeout), check it serves this run's model and was started by
        `grpo vllm-serve`, and pick the weight transport for `model`."""
        models = self.http.call("/v1/models").get("data") or [{}]
        served = {str(m.get(key)) for m in models for key in ("id", "root") if m.get(key)}
        if not any(_names(s) & _names(self.model_name) for s in served):
            raise VllmServerError(f"the vLLM server at {self.url} serves {', '.join(sorted(served)) or 'no model'}, "
                                  f"not this run's model {self.model_name}: start it with {self.http.command}")
        self.served, self.max_model_len = models[0].get("id"), int(models[0].get("max_model_len") or 0)
        info = self._rpc("grpo_info", [])
        if info.get("logprobs_mode") != "processed_logprobs":
            raise VllmServerError(f"the vLLM server at {self.url} returns {info.get('logprobs_mode')}, not the "
                                  f"sampler's processed log-probs: start it with {self.http.command}")
        if not self.main:
            return
        if self.device.type == "cuda" and info.get("weight_transfer") == "nccl" and vllm_importable():
            world = self.http.call("/get_world_size")["world_size"]
            host = urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"
            self.transport = NcclWeights(lambda path, body: self.http.call(path, body, method="POST"), host,
                                         int(world), model, self.device)
        else:
            self.transport = FileWeights(self._rpc)

    def _rpc(self, method: str, args: list) -> Any:
        """One method of GrpoWorkerExtension in every server worker (vLLM's dev-mode /collective_rpc); the
        first worker's answer."""
        try:
            out = self.http.call("/collective_rpc", {"method": method, "args": args})
        except StatusError as e:
            if e.status == 404 or (e.status == 500 and f"'{method}'" in str(e)):
                raise VllmServerError(f"the vLLM server at {self.url} takes no weight updates (no grpo worker "
                                      f"extension / dev mode: HTTP {e.status} on /collective_rpc): start it with "
                                      f"{self.http.command}") from None
            raise
        return ((out or {}).get("results") or [None])[0]

    # generation ---------------------------------------------------------------------------------------------

    def _request(self, ids: list[int], seed: int, params: SamplingParams) -> list[dict]:
        """The n completions of one prompt (the server's choices, in order)."""
        room = self.max_model_len - len(ids) if self.max_model_len else params.max_tokens
        if room < 1:
            raise VllmServerError(f"a prompt of {len(ids)} tokens leaves no room in the vLLM server at {self.url} "
                                  f"(max_model_len {self.max_model_len}): start it with a larger --max-model-len")
        body = {"model": self.served, "prompt": ids, "n": params.n, "seed": seed,
                "max_tokens": min(params.max_tokens, room), "temperature": params.temperature,
                "top_p": params.top_p, "top_k": params.top_k or -1, "min_p": params.min_p,
                "repetition_penalty": params.repetition_penalty, "stop_token_ids": list(params.stop_token_ids),
                "ignore_eos": True, "return_token_ids": True, "skip_special_tokens": False}
        if params.logprobs is not None:
            body["logprobs"] = params.logprobs
        return sorted(self.http.call("/v1/completions", body)["choices"], key=lambda c: c["index"])

    @torch.no_grad()
    def generate(self, prompt_ids, prompt_mask, params: SamplingParams, *, prompt_index=None,
                 model_inputs=None) -> Generation:
        if model_inputs:
            from grpo.config import ConfigError

            raise ConfigError(f"the vLLM server engine generates from token ids only, not from "
                              f"{', '.join(model_inputs)}: use rollout.engine native or transformers")
        B, n = prompt_ids.size(0), params.n
        index = torch.arange(B, device="cpu") if prompt_index is None else prompt_index
        prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]
        seeds = prompt_seeds(params.seed, index)
        answers = self._map(lambda p: self._request(*p, params), zip(prompts, seeds))
        rows = [c for choices in answers for c in choices]                                   # B * n
        stop = set(params.stop_token_ids)
        T = max(1, max(len(c["token_ids"]) for c in rows))
        ids = torch.full((B * n, T), self.pad_token_id, dtype=torch.long, device="cpu")
        mask = torch.zeros(B * n, T, dtype=torch.long, device="cpu")
        logprobs = torch.zeros(B * n, T, device="cpu")
        truncated = torch.ones(B * n, dtype=torch.bool, device="cpu")
        for r, c in enumerate(rows):
            tokens = c["token_ids"]
            ids[r, :len(tokens)], mask[r, :len(tokens)] = torch.tensor(tokens, dtype=torch.long, device="cpu"), 1
            truncated[r] = not tokens or tokens[-1] not in stop
            if params.logprobs is not None and params.temperature > 0 and c.get("logprobs"):
                values = [v if v is not None else 0.0 for v in c["logprobs"]["token_logprobs"]][:len(tokens)]
                logprobs[r, :len(values)] = torch.tensor(values, device="cpu")
        device = prompt_ids.device
        return Generation(prompt_ids=prompt_ids.repeat_interleave(n, dim=0),
                          prompt_mask=prompt_mask.repeat_interleave(n, dim=0),
                          completion_ids=ids.to(device), completion_mask=mask.to(device),
                          sampling_logprobs=logprobs.to(device), truncated=truncated.to(device))

    def prompt_logprobs(self, sequences: list[list[int]], start: list[int]) -> list[list[float]]:
        """The server's log-probs of each sequence's tokens from `start` on, given those before (the raw
        distribution: vLLM's prompt log-probs), as the colocated engine's."""
        def one(seq: list[int], s: int) -> list[float]:
            body = {"model": self.served, "prompt": seq, "max_tokens": 1, "prompt_logprobs": 0}
            rows = self.http.call("/v1/completions", body)["choices"][0]["prompt_logprobs"]
            return [rows[i][str(seq[i])]["logprob"] for i in range(s, len(seq))]

        return self._map(lambda p: one(*p), zip(sequences, start))

    def _map(self, fn, items) -> list:
        """fn over items, one request each in flight at once."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(MAX_CONCURRENT, thread_name_prefix="grpo-vllm")
        return list(self.pool.map(fn, items))

    def generate_episodes(self, prompt_ids, prompt_mask, driver, params: SamplingParams, *,
                          prompt_index=None) -> Generation:
        return play_turns(self, Prompts(prompt_ids, prompt_mask, prompt_index), driver, params, self.pad_token_id)

    # weights ------------------------------------------------------------------------------------------------

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push the policy's full weights into the server (every update), then reset its prefix cache."""
        if self.main:
            self.transport.push(model)
            for _ in range(20):                         # refused only while blocks are held by running requests
                if (self.http.call("/reset_prefix_cache", {}) or {}).get("success", True):
                    break
                time.sleep(0.1)
        if self.distributed:
            torch.distributed.barrier()                 # no rank generates from the old weights

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        if self.transport is not None:
            transport, self.transport = self.transport, None
            try:
                transport.close()
            except OSError:
                pass                                     # a server already gone has nothing left to release


def server_url(vc) -> str:
    """rollout.vllm's server: server_base_url, else http://server_host:server_port."""
    return (vc.server_base_url or f"http://{vc.server_host}:{vc.server_port}").rstrip("/")


def build_server_engine(cfg, model: torch.nn.Module, tokenizer, device) -> ServerEngine:
    """The engine of rollout.vllm.mode server over `model` (already placed and restored): connected to the server
    and holding the policy's current weights."""
    from grpo.modeling.models import EMBEDDED_MODEL_DIR

    vc = cfg.rollout.vllm
    engine = ServerEngine(server_url(vc), vc.server_timeout, cfg.model.path or str(EMBEDDED_MODEL_DIR),
                          tokenizer.pad_token_id, device)
    engine.connect(model)
    engine.sync_weights(model)                          # a resumed or LoRA policy differs from the served files
    return engine
