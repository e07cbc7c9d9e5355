"""Old import paths of the flat layout (before the subpackages), kept for one release.

``import grpo.loss`` (or ``from grpo.trainer import train``) still works: a meta-path finder
answers each old name with a module that forwards every attribute to its new home, and warns once
with a ``DeprecationWarning`` naming the new path. The CLI, config keys, output files and the
``grpo.Trainer`` API are unchanged; only module paths moved (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

#: old module -> the new module(s) its names now live in (searched in order).
MOVED: dict[str, tuple[str, ...]] = {
    "grpo.advantages": ("grpo.algorithms.advantages",),
    "grpo.loss": ("grpo.algorithms.loss",),
    "grpo.shaping": ("grpo.algorithms.shaping",),
    "grpo.config_checks": ("grpo.config.checks",),
    "grpo.presets": ("grpo.config.presets",),
    "grpo.trl_compat": ("grpo.config.trl",),
    "grpo.models": ("grpo.modeling.models",),
    "grpo.logprobs": ("grpo.modeling.logprobs",),
    "grpo.shared_prompt": ("grpo.modeling.shared_prompt",),
    "grpo.kernels": ("grpo.cpu.kernels", "grpo.cpu.placement"),
    "grpo.lora": ("grpo.modeling.lora",),
    "grpo.reference": ("grpo.modeling.reference",),
    "grpo.precision": ("grpo.modeling.precision",),
    "grpo.rollout.decoder": ("grpo.modeling.decoder",),
    "grpo.datasets_io": ("grpo.data.datasets_io",),
    "grpo.tasks": ("grpo.data.tasks",),
    "grpo.tasks.arithmetic": ("grpo.data.tasks.arithmetic",),
    "grpo.checkpoint": ("grpo.state.checkpoint", "grpo.state.model_files"),
    "grpo.resume": ("grpo.state.resume",),
    "grpo.resume_config": ("grpo.state.resume_config",),
    "grpo.signals": ("grpo.state.signals",),
    "grpo.metrics": ("grpo.state.metrics",),
    "grpo.tracking": ("grpo.state.tracking",),
    "grpo.export": ("grpo.state.export", "grpo.state.model_files"),
    "grpo.guards": ("grpo.state.output_dir", "grpo.training.guards"),
    "grpo.experience": ("grpo.training.experience",),
    "grpo.update": ("grpo.training.update",),
    "grpo.trainer": ("grpo.training.loop", "grpo.api.trainer"),
    "grpo.distributed": ("grpo.training.distributed",),
    "grpo.world": ("grpo.training.world",),
    "grpo.runtime": ("grpo.training.runtime",),
    "grpo.run_checks": ("grpo.training.run_checks",),
    "grpo.callbacks": ("grpo.training.callbacks",),
    "grpo.sft": ("grpo.training.sft",),
    "grpo.evaluate": ("grpo.training.evaluate",),
    "grpo.inputs": ("grpo.api.inputs",),
    "grpo.demo": ("grpo.cli.demo",),
    "grpo.plots": ("grpo.cli.plots",),
    "grpo.rewards.check": ("grpo.cli.rewards_check",),
    # the CPU-only machinery, out of grpo/modeling into grpo/cpu (reached from the CPU runtime only)
    "grpo.modeling.cpu_kernels": ("grpo.cpu.kernels", "grpo.cpu.placement"),
    "grpo.modeling.native_gemm": ("grpo.cpu.native_gemm",),
    "grpo.modeling.native_attention": ("grpo.cpu.native_attention",),
    "grpo.modeling.native_elementwise": ("grpo.cpu.native_elementwise",),
    "grpo.modeling.heap": ("grpo.cpu.heap",),
    "grpo.modeling.workspace": ("grpo.cpu.workspace",),
    "grpo.modeling.grad_in_place": ("grpo.cpu.grad_in_place", "grpo.modeling.in_place"),
    "grpo.modeling.vml_warmup": ("grpo.cpu.vml_warmup",),
}


class _Forward(types.ModuleType):
    """An old module name: every attribute comes from the new module(s), on first use."""

    def __init__(self, name: str, targets: tuple[str, ...]):
        super().__init__(name, f"moved to {', '.join(targets)}")
        self._targets = targets

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self._targets)}) has no attribute {attr!r}")

    def __dir__(self):
        return sorted({n for t in self._targets for n in dir(importlib.import_module(t))})


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        targets = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {' / '.join(targets)}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=3)
        module = _Forward(spec.name, targets)
        if spec.submodule_search_locations is not None:
            module.__path__ = []                          # a package: its old submodules resolve here too
        return module

    def exec_module(self, module) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=fullname == "grpo.tasks")


def install() -> None:
    """Answer the old module names (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
