"""The engine seam: every rollout (training, multi-turn episodes, evaluation) generates through one of these.

    prompt token ids [B, P] + SamplingParams (grpo/rollout/params.py)
        -> engine.generate -> Generation: completion ids [B*n, T], the sampler's log-probs, finish reasons

An engine is told when the policy's weights changed (``sync_weights`` after every optimizer update; the
native and transformers engines read the live policy and need nothing) and can ``sleep`` (free its cache
during the update) and ``wake``. ``rollout.engine`` picks one (:data:`ENGINES`); ``auto`` takes the fastest
measured for the device (:data:`MEASURED_FASTEST`, from bench/engines.py's results).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from grpo.rollout.params import SamplingParams
from grpo.types import Generation


class EngineUnavailable(RuntimeError):
    """An engine that cannot run here (its package missing, a server unreachable): one line, naming the fix."""


class Engine(Protocol):
    name: str

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams, *,
                 prompt_index: torch.Tensor | None = None, model_inputs: dict | None = None) -> Generation:
        """n completions of each left-padded prompt; row i*n + j is completion j of prompt i.
        Shape: prompt_ids, prompt_mask [B, P], prompt_index [B] long -> Generation of B * n rows."""

    def generate_episodes(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, driver, params: SamplingParams,
                          *, prompt_index: torch.Tensor | None = None) -> Generation:
        """Multi-turn episodes (grpo/rollout/multiturn.py's driver and Generation contract)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """The policy's weights changed (after an optimizer update): generate from them from now on."""

    def sleep(self) -> None: ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


#: name -> factory(cfg, model, tokenizer, device) -> Engine; filled by grpo/rollout/engines/__init__.py.
ENGINES: dict[str, Callable] = {}

#: device type -> the engine bench/engines.py measured fastest there (bench/results/engines.json; a test keeps
#: the two in step). CUDA is not measured on this project's machines: vLLM there is every peer's choice, and
#: `auto` takes it when the package imports, else the native sampler.
MEASURED_FASTEST: dict[str, str] = {"cpu": "native", "meta": "native"}


def register(name: str):
    def wrap(factory: Callable) -> Callable:
        ENGINES[name] = factory
        return factory
    return wrap


def vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def resolve_engine_name(spec: str, device: torch.device) -> str:
    """`rollout.engine` -> the engine to build: auto -> the measured fastest for `device`'s type."""
    if spec != "auto":
        return spec
    if device.type == "cuda":
        return "vllm" if vllm_importable() else "native"
    return MEASURED_FASTEST.get(device.type, "native")


def build_engine(cfg, model: torch.nn.Module, tokenizer, device: torch.device) -> Engine:
    """The engine `cfg.rollout.engine` names, over the placed policy `model` (grpo/rollout/engines/)."""
    import grpo.rollout.engines  # noqa: F401  (fills ENGINES)

    name = resolve_engine_name(cfg.rollout.engine, torch.device(device))
    return ENGINES[name](cfg, model, tokenizer, torch.device(device))
