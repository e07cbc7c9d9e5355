"""grpo: post-train language models with GRPO and its family of algorithms.

The public Python API (docs/python-api.md)::

    import grpo
    result = grpo.Trainer(model, reward_funcs=[fn], train_dataset=rows, config={...}).train()

Names are imported on first use, so ``import grpo`` (and the command line's start) stays light.
"""

__version__ = "0.1.0"

from grpo import _compat

_compat.install()                 # the flat layout's module paths forward here for one release

#: Public name -> the module that defines it.
_EXPORTS = {
    "Trainer": "grpo.api.trainer",
    "Callback": "grpo.training.callbacks",
    "Config": "grpo.config",
    "ConfigError": "grpo.config",
    "build_config": "grpo.config",
    "TrainResult": "grpo.training.loop",
    "evaluate": "grpo.training.evaluate",
    "load_reward": "grpo.rewards",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpo' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))
