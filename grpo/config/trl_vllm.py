"""TRL's generation-backend keys -> `rollout.engine` and `rollout.vllm.*` (grpo/config/engine.py), for
grpo/config/trl.py.

`use_vllm: true` is `rollout.engine: vllm`. `use_vllm: false` (TRL's default: transformers' `model.generate`)
leaves `rollout.engine` as configured: its default, auto, takes the engine measured fastest for the device
(grpo's native sampler on CPU, faster there than `model.generate`; vLLM on CUDA when it is installed), and
`rollout.engine: transformers` is `model.generate` itself for whoever wants TRL's path. Each `vllm_*` key maps
to its `rollout.vllm.*` key (:data:`VLLM_KEYS`), its value checked against TRL's vocabulary; TRL 1.16's
defaults of these keys are grpo's (:data:`TRL_VLLM_DEFAULTS`) but for three that change no result:
`vllm_model_impl` vllm (grpo: auto, vLLM's own choice, its implementation where it has one), `vllm_server_host`
0.0.0.0 (grpo: 127.0.0.1, the same local server) and `vllm_max_model_length` None (the model's context; grpo: 0,
the longest prompt plus rollout.max_new_tokens). :data:`ENGINE_NOTES`: the keys of this family with no counterpart
here, and why.

The rollout correction TRL applies to vLLM's samples (`vllm_importance_sampling_correction`, on by default) is on
by default here under `rollout.engine: vllm` too, however the engine was chosen (TRL key, YAML, flag): grpo/config/
build.py sets `algorithm.rollout_correction` to :data:`VLLM_ROLLOUT_CORRECTION` unless it is given (TRL's
`vllm_importance_sampling_correction: false` gives it as none). TRL's bounds are grpo's defaults already
(`rollout_correction.max` 3.0, `rollout_correction.min` empty).
"""

from __future__ import annotations

from typing import Any, Callable

from grpo.config.errors import ConfigError
from grpo.config.trl_values import same_value

#: TRL 1.16 GRPOConfig's defaults of the keys below (trl/trainer/grpo_config.py), for the record and the tests.
TRL_VLLM_DEFAULTS = {"use_vllm": False, "vllm_mode": "colocate", "vllm_model_impl": "vllm",
                     "vllm_enable_sleep_mode": False, "vllm_server_base_url": None, "vllm_server_host": "0.0.0.0",
                     "vllm_server_port": 8000, "vllm_server_timeout": 240.0, "vllm_group_port": 51216,
                     "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": None,
                     "vllm_tensor_parallel_size": 1, "vllm_importance_sampling_correction": True,
                     "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 3.0,
                     "vllm_importance_sampling_clip_min": None}

#: algorithm.rollout_correction under rollout.engine vllm when not given: TRL's vllm_importance_sampling_mode default.
VLLM_ROLLOUT_CORRECTION = TRL_VLLM_DEFAULTS["vllm_importance_sampling_mode"]


def _one_of(key: str, names: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in names:
            raise ConfigError(f"TRL key '{key}': '{value}' is none of {' | '.join(names)}")
        return value
    return convert


def _fraction(value: float) -> float:
    if not 0 < value <= 1:
        raise ConfigError(f"TRL key 'vllm_gpu_memory_utilization' must be in (0, 1], got {value}")
    return value


def _seconds(value: float) -> float:
    if value <= 0:
        raise ConfigError(f"TRL key 'vllm_server_timeout' must be > 0 seconds, got {value}")
    return value


#: TRL's vllm_* keys -> (our key, value conversion); merged into grpo/config/trl.py's TRL_KEYS.
VLLM_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "vllm_mode": ("rollout.vllm.mode", _one_of("vllm_mode", ("colocate", "server"))),
    "vllm_gpu_memory_utilization": ("rollout.vllm.gpu_memory_utilization", _fraction),
    "vllm_tensor_parallel_size": ("rollout.vllm.tensor_parallel_size", same_value),
    "vllm_enable_sleep_mode": ("rollout.vllm.enable_sleep_mode", same_value),
    "vllm_max_model_length": ("rollout.vllm.max_model_length", lambda v: 0 if v is None else v),  # None: sized here
    "vllm_model_impl": ("rollout.vllm.model_impl", _one_of("vllm_model_impl", ("vllm", "transformers", "auto"))),
    "vllm_server_base_url": ("rollout.vllm.server_base_url", lambda v: v or None),
    "vllm_server_host": ("rollout.vllm.server_host", same_value),
    "vllm_server_port": ("rollout.vllm.server_port", same_value),
    "vllm_server_timeout": ("rollout.vllm.server_timeout", _seconds),
}

_CONTINUOUS = ("transformers' continuous batching is no engine here: rollout.engine picks one (auto: the fastest "
               "measured for the device; transformers: plain model.generate)")

#: Generation-backend keys that change nothing here, and why (part of grpo/config/trl.py's NO_EFFECT).
ENGINE_NOTES = {
    "vllm_group_port": ("the NCCL port through which TRL's trainer sends weights to its own `trl vllm-serve`; grpo's "
                        "server mode talks to `grpo vllm-serve` at rollout.vllm.server_base_url (or server_host:"
                        "server_port) and opens no such group"),
    "cache_implementation": ("model.generate's KV-cache type (TRL: use_vllm false); grpo's engines keep their own "
                             "caches (rollout.engine transformers: transformers' default)"),
    **dict.fromkeys(("use_transformers_paged", "use_transformers_continuous_batching",
                     "transformers_continuous_batching_config"), _CONTINUOUS),
}


def engine_overrides(trl: dict[str, Any]) -> dict[str, Any]:
    """use_vllm true -> rollout.engine vllm; false, written out -> native (grpo's own sampler, the fast counterpart of
    TRL's model.generate: a GPU host with vLLM installed then keeps vLLM out, as the user asked); absent -> as
    configured."""
    if "use_vllm" not in trl:
        return {}
    return {"rollout.engine": "vllm" if trl["use_vllm"] else "native"}

