"""The Python API: ``grpo.Trainer`` (``trainer``) and the resolution of its inputs (``inputs``:
models, datasets, reward functions and configs given as objects, paths or TRL-style keys)."""

from grpo.api.trainer import Trainer, train  # noqa: F401
