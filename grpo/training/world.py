"""One process or many: the object the loop talks to, with the same methods either way.

:class:`LocalWorld` is a plain `python -m grpo train` (or `grpo.Trainer(...).train()`) run;
:class:`TorchrunWorld` is one rank of a data-parallel run under torchrun (grpo/training/distributed.py holds
its collectives and the DDP / FSDP2 wrapping). The loop never asks which one it has.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from grpo.config import Config
from grpo.state.metrics import MetricsLogger
from grpo.state.resume import TrainState, save_state


class LocalWorld:
    """A single process: the policy trains as it is, metrics and checkpoints are written here."""

    rank, world_size, is_main = 0, 1, True

    def __init__(self) -> None:
        self.policy: torch.nn.Module | None = None

    def shard(self, state: TrainState, cfg: Config) -> Config:
        """The config this process samples with (all of the step's prompts)."""
        return cfg

    def prepare(self, state: TrainState, cfg: Config) -> None:
        self.policy = state.model

    def update_target(self) -> tuple[torch.nn.Module, Any]:
        """(the module the optimizer steps, the update's data-parallel hooks: None = grpo.training.update.SingleProcess)."""
        return self.policy, None

    def after_update(self, state: TrainState) -> None:
        pass

    def view(self, exp):
        """The experience as the step's metrics see it (grpo.types.StepSummary)."""
        return exp.summary()

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def barrier(self) -> None:
        pass

    def save(self, out: Path, step: int, state: TrainState, cfg: Config) -> Path:
        return save_state(out, step, state, cfg)

    def logger(self, path: Path, total_steps: int, progress_bar: bool, initial: int, **kw):
        return MetricsLogger(path, total_steps, progress_bar, initial=initial, **kw)

    def close(self) -> None:
        pass


class TorchrunWorld:
    """One rank of a torchrun run (see grpo/training/distributed.py): sharded prompts, wrapped policy, reduced metrics,
    rank-0 files."""

    def __init__(self, par) -> None:
        self.par = par
        self.rank, self.world_size, self.is_main = par.rank, par.world_size, par.rank == 0

    def shard(self, state: TrainState, cfg: Config) -> Config:
        """This rank's slice of every step's prompts (sampling is keyed by their global indices, so the
        ranks draw what one process would: grpo/rollout/keyed.py)."""
        from grpo.training.distributed import ShardedStream

        state.stream = ShardedStream(state.stream, self.rank, self.world_size)
        return dataclasses.replace(cfg, train=dataclasses.replace(
            cfg.train, prompts_per_step=cfg.train.prompts_per_step // self.world_size))

    def prepare(self, state: TrainState, cfg: Config) -> None:
        """Wrap the (restored) policy in DDP / FSDP2."""
        from grpo.training.distributed import barrier

        self.par.prepare(state, cfg)
        barrier()

    def update_target(self) -> tuple[torch.nn.Module, Any]:
        return self.par.policy, self.par

    def after_update(self, state: TrainState) -> None:
        self.par.after_update(state)                   # FSDP2: new full weights into the rollout model

    def view(self, exp):
        from grpo.training.distributed import global_summary

        return global_summary(exp.summary())           # rewards, lengths and counts of every rank

    def any(self, flag: bool) -> bool:
        from grpo.training.distributed import any_rank

        return any_rank(flag)

    def barrier(self) -> None:
        from grpo.training.distributed import barrier

        barrier()

    def save(self, out: Path, step: int, state: TrainState, cfg: Config) -> Path:
        """Every rank joins the gathering of the full state; rank 0 writes the checkpoint."""
        from grpo.training.distributed import barrier

        optimizer = self.par.checkpoint_optimizer(state)
        path = out / f"checkpoint-{step}"
        if self.is_main:
            path = save_state(out, step, dataclasses.replace(state, optimizer=optimizer), cfg,
                              extra_info={"world_size": self.world_size})
        barrier()
        return path

    def logger(self, path: Path, total_steps: int, progress_bar: bool, initial: int, **kw):
        from grpo.training.distributed import NullLogger

        return MetricsLogger(path, total_steps, progress_bar, initial=initial, **kw) if self.is_main else NullLogger()

    def close(self) -> None:
        from grpo.training.distributed import shutdown

        shutdown(self.par)


def init_world(cfg: Config, device: torch.device) -> LocalWorld | TorchrunWorld:
    """LocalWorld for one process; under torchrun (WORLD_SIZE > 1) join the process group on `device`."""
    from grpo.training import distributed

    par = distributed.init(cfg, device)
    return LocalWorld() if par is None else TorchrunWorld(par)
