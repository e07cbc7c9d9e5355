"""Data-parallel GRPO under `torchrun` (see docs/distributed.md).

World size 1 (plain `python -m grpo train`) is a no-op: :func:`init` returns None and the trainer
runs exactly the single-process code. With WORLD_SIZE > 1 (set by torchrun):

* the process group is gloo on CPU, NCCL on GPU;
* every rank draws the SAME global prompt order and keeps its slice of each step's prompts
  (:class:`ShardedStream`), so all G completions of a prompt are on one rank; sampling is keyed by
  (seed, global prompt index), so the ranks draw exactly the completions one process would;
* the update runs through DDP or FSDP2 (`train.parallel`); the loss normaliser is global and the loss is
  multiplied by the world size (both average gradients over ranks), so one step equals the
  single-process step on the same global batch;
* rewards, metrics and token counts are reduced globally; rank 0 writes metrics and checkpoints
  (a checkpoint holds the full weights and optimizer state and resumes on any number of ranks).

Batch-statistics advantages (algorithm.advantage reinforce_pp, grpo with scale_rewards batch), dynamic sampling
and top-entropy token selection need the whole batch on one process: they are single-process only for now
(ConfigError).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from grpo.accelerator import accelerator
from grpo.config import Config, ConfigError
from grpo.modeling.logprobs import completion_logprobs


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def barrier() -> None:
    if is_dist():
        dist.barrier()


def all_reduce_sum(values):
    """Sum over ranks of a float, a list of floats, or a tensor (returned as the same kind)."""
    if not is_dist():
        return values
    if isinstance(values, torch.Tensor):
        out = values.detach().to(collective_device(), copy=True)      # NCCL reduces device tensors only
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(values.device)
    scalar = not isinstance(values, (list, tuple))
    t = torch.tensor([values] if scalar else list(values), dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t[0]) if scalar else [float(v) for v in t]


def collective_device() -> torch.device:
    """Where tensors handed to a collective must live: the current CUDA device under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return accelerator("cuda").current_device()
    return torch.device("cpu")


def any_rank(flag: bool) -> bool:
    """True when `flag` is true on any rank (e.g. a stop signal seen by one process)."""
    return bool(all_reduce_sum(float(bool(flag)))) if is_dist() else bool(flag)


def all_gather_object(obj: Any) -> list[Any]:
    if not is_dist():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def check_config(cfg: Config, world: int) -> None:
    """The settings that must divide evenly or that are single-process only."""
    tc, algo = cfg.train, cfg.algorithm
    if tc.prompts_per_step % world:
        raise ConfigError(f"train.prompts_per_step={tc.prompts_per_step} must be divisible by the world size {world}")
    if algo.advantage == "reinforce_pp" or getattr(algo.advantage.params, "scale_rewards", None) == "batch":
        raise ConfigError("algorithm.advantage reinforce_pp and algorithm.advantage.scale_rewards batch use batch "
                          "statistics: single-process only for now")
    if algo.dynamic_sampling:
        raise ConfigError("algorithm.dynamic_sampling is single-process only for now")
    if algo.top_entropy_rho < 1:
        raise ConfigError("algorithm.top_entropy_rho < 1 is single-process only for now")
    if cfg.lora.enabled and tc.parallel == "fsdp2":
        raise ConfigError("train.parallel=fsdp2 with lora.enabled is not supported (use ddp)")


class ShardedStream:
    """A rank's view of the global PromptStream: next(n) draws n * world rows, keeps this rank's n."""

    def __init__(self, stream, rank_: int, world: int):
        self.inner, self.rank, self.world = stream, rank_, world

    def next(self, n: int) -> list[dict[str, Any]]:
        return self.next_indexed(n)[0]

    def next_indexed(self, n: int) -> tuple[list[dict[str, Any]], list[int]]:
        """This rank's n rows and their global indices (draw positions in the global order)."""
        rows, index = self.inner.next_indexed(n * self.world)
        mine = slice(self.rank * n, (self.rank + 1) * n)
        return rows[mine], index[mine]

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    @property
    def rows(self):
        return self.inner.rows

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


class LogprobForward(torch.nn.Module):
    """The update's forward pass as one module, so DDP / FSDP2 hooks see it whole (same code path as
    a single process, chunked LM head included)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, T: int, temperature: float, with_entropy: bool,
                entropy_grad: bool, chunk_size: int, model_inputs=None, host=None):
        return completion_logprobs(self.model, input_ids, attention_mask, T, temperature, with_entropy=with_entropy,
                                   entropy_grad=entropy_grad, chunk_size=chunk_size, model_inputs=model_inputs,
                                   host=host)


class FrozenOptimizerState:
    """Stands in for an optimizer when writing a checkpoint (a gathered full state dict)."""

    def __init__(self, state: dict[str, Any]):
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


@dataclass
class Parallel:
    """One rank of a data-parallel run: the wrapped training module and the collectives the update needs."""

    rank: int
    world_size: int
    local_rank: int
    kind: str                                  # ddp | fsdp2
    device: torch.device
    policy: torch.nn.Module | None = None      # the module whose parameters the optimizer steps
    wrapped: torch.nn.Module | None = None     # DDP(LogprobForward(policy)) or fully_shard(LogprobForward(copy))
    names: list[str] = field(default_factory=list)   # FQNs of the trainable parameters (FSDP2 optimizer state)

    # ---- the update
    def forward(self, input_ids, attention_mask, T, temperature, with_entropy, entropy_grad, chunk_size,
                model_inputs=None, host=None):
        return self.wrapped(input_ids, attention_mask, T, temperature, with_entropy, entropy_grad, chunk_size,
                            model_inputs=model_inputs, host=host)   # host: a plain object, left on the CPU

    def reduce(self, sums: torch.Tensor) -> torch.Tensor:
        """The step's statistics (float64, on the device) summed over ranks, on the device: no host read."""
        return all_reduce_sum(sums)

    def match_micro_batches(self, buckets: list) -> list:
        """The same number of micro-batches on every rank (FSDP2 reduce-scatters after each backward):
        a rank with fewer re-splits its rows into the largest count (every rank has as many rows)."""
        counts = all_gather_object(len(buckets))
        K = max(counts)
        if len(buckets) == K:
            return buckets
        device = next((b.device for b in buckets if isinstance(b, torch.Tensor)), torch.device("cpu"))
        rows = torch.cat([b if isinstance(b, torch.Tensor) else torch.arange(b.start, b.stop, device=device)
                          for b in buckets])
        return list(torch.tensor_split(rows, K))

    def no_sync(self, last: bool):
        """DDP: skip the gradient all-reduce on all but the last micro-batch (FSDP2 reduces every time)."""
        if self.kind == "ddp" and not last:
            return self.wrapped.no_sync()
        return contextlib.nullcontext()

    def normalizer(self, agg, mask: torch.Tensor, L: int) -> float:
        """The aggregation's normaliser over the GLOBAL step mask (all ranks' rows)."""
        masks = all_gather_object(mask.detach().to("cpu", torch.bool))    # `mask`: the host view's (no device read)
        width = max(m.shape[1] for m in masks)
        full = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in masks]).to(mask.dtype)
        return agg.normalizer(full, L)

    def clip_grad_norm(self, params, max_norm: float) -> torch.Tensor:
        """The global gradient norm (FSDP2: over every shard), on the device, after clipping to it."""
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads)
        if hasattr(total, "full_tensor"):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    # ---- the trainer
    def prepare(self, state, cfg: Config) -> None:
        """Wrap the (restored) policy for training; FSDP2 shards a copy and rebuilds the optimizer on it."""
        from grpo.training.update import build_optimizer

        if self.kind == "ddp":
            self.policy = state.model
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.wrapped = torch.nn.parallel.DistributedDataParallel(LogprobForward(state.model), device_ids=ids)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        module = LogprobForward(copy.deepcopy(state.model))
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        self.wrapped = fully_shard(module, mesh=mesh)
        self.policy = module.model
        optimizer, scheduler = build_optimizer(self.wrapped, cfg.optim, cfg.train.max_steps * cfg.algorithm.updates_per_step)
        saved = state.optimizer.state_dict()
        if saved.get("state"):          # resumed: the checkpoint's (full, id-keyed) state
            set_optimizer_state_dict(self.wrapped, optimizer, self._by_name(saved),
                                     options=StateDictOptions(full_state_dict=True))
        scheduler.load_state_dict(state.scheduler.state_dict())
        state.optimizer, state.scheduler = optimizer, scheduler

    def _by_name(self, osd: dict[str, Any]) -> dict[str, Any]:
        """A plain optimizer state dict (params by position) keyed by parameter names instead."""
        groups = [{**g, "params": [self.names[i] for i in g["params"]]} for g in osd["param_groups"]]
        return {"state": {self.names[i]: v for i, v in osd["state"].items()}, "param_groups": groups}

    def after_update(self, state) -> None:
        """FSDP2: copy the new full weights into the plain model used for rollout / reference / saving."""
        if self.kind != "fsdp2":
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.wrapped, options=StateDictOptions(full_state_dict=True))
        prefix = "model."
        with torch.no_grad():
            state.model.load_state_dict({k[len(prefix):]: v for k, v in full.items()}, strict=False)

    def checkpoint_optimizer(self, state):
        """What the checkpoint stores as the optimizer (collective for FSDP2: every rank must call it)."""
        if self.kind != "fsdp2":
            return state.optimizer
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        osd = get_optimizer_state_dict(self.wrapped, state.optimizer,
                                       options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not osd:
            return FrozenOptimizerState({})
        index = {name: i for i, name in enumerate(self.names)}
        groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]
        return FrozenOptimizerState({"state": {index[n]: v for n, v in osd["state"].items()}, "param_groups": groups})


#: The process-group backend of each device type (grpo.training.runtime decides the device).
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def init(cfg: Config, device: torch.device | None = None) -> Parallel | None:
    """Join the torchrun process group on `device` (gloo on CPU, NCCL on CUDA); None for a single process."""
    world = env_world_size()
    if world <= 1:
        return None
    check_config(cfg, world)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu") if device is None else device
    backend = BACKENDS[device.type]
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return Parallel(dist.get_rank(), dist.get_world_size(), local, cfg.train.parallel, device)


def shutdown(par: Parallel | None = None) -> None:
    """Leave the process group.

    DDP's reducer and FSDP2's mesh hold references to the group, so they are dropped first: the
    group must be destroyed here, not later by the garbage collector. A group destroyed inside a
    Python deallocation (GIL held) can deadlock with gloo's worker thread, which takes the GIL to
    free finished work (seen as a hang once in ~8 runs of tests/training/test_distributed.py)."""
    if par is not None:
        par.wrapped = par.policy = None
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ---- metrics over all ranks

def global_summary(summary):
    """The step's summary (grpo.types.StepSummary) merged over every rank: rewards, lengths and counts."""
    from grpo.types import StepSummary

    return StepSummary.merge(all_gather_object(summary.to_host()))


class NullLogger:
    """The metrics logger of ranks other than 0."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def log(self, metrics) -> None:
        pass

    def sync(self) -> None:
        pass
