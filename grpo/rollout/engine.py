"""The engine seam: every rollout (training, multi-turn episodes, evaluation) generates through one of these.

    prompt token ids [B, P] + SamplingParams (grpo/rollout/params.py)
        -> engine.generate -> Generation: completion ids [B*n, T], the sampler's log-probs, finish reasons

An engine is told when the policy's weights changed (``sync_weights`` after every optimizer update; the
native and transformers engines read the live policy and need nothing) and can ``sleep`` (free its cache
during the update) and ``wake``. ``rollout.engine`` picks one (:data:`ENGINES`); ``auto`` takes the fastest
measured for the device and model size (:data:`MEASURED_FASTEST`, from bench/engines.py's results).
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


class OnLivePolicy:
    """What an engine that samples from the live policy object needs (native, transformers): a sync only rebinds
    the model, and there is nothing to sleep, wake or close."""

    model: torch.nn.Module

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass


#: name -> factory(cfg, model, tokenizer, device) -> Engine; filled by grpo/rollout/engines/__init__.py.
ENGINES: dict[str, Callable] = {}

#: device type -> ((parameters from, engine), ...): the engine bench/engines.py measured fastest per GRPO step, by
#: model size (bench/results/engines.json, "winner_by_model"; tests/rollout/test_engines_bench.py keeps the two in
#: step). On CPU the 0.8M embedded model is overhead-bound and grpo's sampler wins; at 100M vLLM's CPU build does
#: (0.80-0.97x the native engine's step). CUDA is not measured on this project's machines: vLLM there is every
#: peer's choice. Where the table says vllm and vLLM is not installed, auto takes the native sampler.
MEASURED_FASTEST: dict[str, tuple[tuple[int, str], ...]] = {
    "cpu": ((0, "native"), (50_000_000, "vllm")),
    "cuda": ((0, "vllm"),),
}


def measured_fastest(device_type: str, parameters: int) -> str:
    """The table's engine for a model of `parameters` on `device_type` (native where nothing was measured)."""
    choice = "native"
    for start, engine in MEASURED_FASTEST.get(device_type, ()):
        if parameters >= start:
            choice = engine
    return choice


def register(name: str):
    def wrap(factory: Callable) -> Callable:
        ENGINES[name] = factory
        return factory
    return wrap


def vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def resolve_engine_name(spec: str, device: torch.device, parameters: int = 0) -> str:
    """`rollout.engine` -> the engine to build: auto -> the measured fastest for the device and the policy's size
    (:data:`MEASURED_FASTEST`), the native sampler where that is vLLM and vLLM is not installed."""
    if spec != "auto":
        return spec
    choice = measured_fastest(device.type, parameters)
    return choice if choice != "vllm" or vllm_importable() else "native"


def build_engine(cfg, model: torch.nn.Module, tokenizer, device: torch.device) -> Engine:
    """The engine `cfg.rollout.engine` names, over the placed policy `model` (grpo/rollout/engines/)."""
    import grpo.rollout.engines  # noqa: F401  (fills ENGINES)

    parameters = sum(p.numel() for p in model.parameters())
    name = resolve_engine_name(cfg.rollout.engine, torch.device(device), parameters)
    return ENGINES[name](cfg, model, tokenizer, torch.device(device))
