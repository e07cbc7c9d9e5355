"""Saving and resuming the whole training state, so an interrupted run continues bit for bit.

A checkpoint captures (see grpo/state/checkpoint.py for the files): the policy (full weights or the LoRA
adapter), optimizer and scheduler, the python / numpy / torch generators, the position
in the data order (grpo.data.prompts.PromptStream; with train.seed it also keys the sampling), the step, and the reference policy when
`algorithm.ref_update_steps` makes it change (otherwise the reference is the initial policy, or the
LoRA base, which the resumed run rebuilds from `model.path`). No rollouts are ever buffered across a
checkpoint: the trainer does all mu = `algorithm.num_iterations` updates of a generation batch
inside one step and saves only at step boundaries.

`train.resume`: `never` | `auto` (the newest checkpoint of output_dir that verifies; a torn or
corrupted newer one is renamed `checkpoint-<step>.invalid` with a one-line warning) | a path.
Resuming at step S drops the records of steps after S from metrics.jsonl, so the finished file
equals that of an uninterrupted run (apart from the time/* and rollout/tokens_per_s values).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from grpo.state.checkpoint import (MANIFEST, CheckpointError, list_checkpoints, remove_stale_temporaries, restore_rng,
                             rng_state, save_checkpoint, verify_checkpoint)
from grpo.config import Config, ConfigError, to_dict
from grpo.state.metrics import ALERTS_FILE, truncate_metrics
from grpo.state.samples import SAMPLES_FILE
from grpo.types import TrainState  # noqa: F401  (what a checkpoint captures)
from grpo.state.resume_config import apply_optimizer_settings, flat_config, refuse_changes

log = logging.getLogger(__name__)

#: Config keys that may change between a run and its resumption without a warning.
NEUTRAL_KEYS = {"train.resume", "train.output_dir", "train.eval_steps", "data.eval_dataset", "train.save_steps", "train.save_total_limit", "train.save_final",
                "train.max_bad_steps", "log.progress_bar", "train.parallel", "log.report_to", "log.project",
                "log.run_name"}


@dataclass
class Checkpoint:
    """A verified checkpoint with its parsed state."""

    path: Path
    step: int
    trainer_state: dict[str, Any]
    optim: dict[str, Any]
    rng: dict[str, Any]
    skipped: list[tuple[Path, str]] = field(default_factory=list)   # newer checkpoints that failed to verify


def refreshed_reference(state: TrainState, cfg: Config) -> torch.nn.Module | None:
    """The reference module whose weights must be saved (only when ref_update_steps changes them)."""
    return getattr(state.reference, "model", None) if cfg.algorithm.ref_update_steps else None


def save_state(output_dir: Path, step: int, state: TrainState, cfg: Config, extra_rng: dict | None = None,
               extra_info: dict | None = None) -> Path:
    """checkpoint-<step> with everything :func:`restore` needs (`extra_*`: torchrun runs, grpo.training.distributed)."""
    tc = cfg.train
    info = {"max_steps": tc.max_steps, "epoch": state.stream.epoch, "num_threads": torch.get_num_threads(),
            "config": to_dict(cfg), **(extra_info or {})}
    return save_checkpoint(output_dir, step, state.model, state.tokenizer, optimizer=state.optimizer,
                           scheduler=state.scheduler, state=info,
                           rng={**rng_state(None, state.stream.state_dict()), **(extra_rng or {})},
                           reference=refreshed_reference(state, cfg), save_total_limit=tc.save_total_limit,
                           extra_files=[x.save for x in state.extras])


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Verify a checkpoint (manifest checksums) and parse its state; CheckpointError names what is wrong."""
    path = Path(path)
    verify_checkpoint(path)
    for name in ("trainer_state.json", "optimizer.pt", "rng_state.pt"):
        if not (path / name).is_file():
            raise CheckpointError(f"{path.name}: no {name} (not a resumable training checkpoint)")
    try:
        trainer_state = json.loads((path / "trainer_state.json").read_text())
        step = int(trainer_state["step"])
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{path.name}: trainer_state.json is unreadable") from None
    try:
        optim = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
        rng = torch.load(path / "rng_state.pt", weights_only=True, map_location="cpu")
    except Exception as e:  # a torn or foreign pickle: name the checkpoint, keep the first line
        raise CheckpointError(f"{path.name}: cannot read its state ({type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    if not isinstance(rng, dict) or not {"python", "numpy", "torch", "stream"} <= set(rng):
        raise CheckpointError(f"{path.name}: rng_state.pt lacks generator states")
    return Checkpoint(path, step, trainer_state, optim, rng)


def find_checkpoint(cfg: Config) -> Checkpoint | None:
    """The checkpoint `train.resume` asks for: None (start at step 0) or a verified one.

    `auto` falls back from an invalid newest checkpoint to the previous one (with a warning) and
    raises CheckpointError when checkpoints exist but none verifies; an explicit path must verify.
    """
    mode, out = cfg.train.resume.strip(), Path(cfg.train.output_dir)
    if mode == "never":
        return None
    if mode != "auto":
        path = Path(mode).expanduser()
        inside = list_checkpoints(path) if path.is_dir() and not (path / MANIFEST).exists() else []
        if inside:                        # a run directory, not one of its checkpoints
            raise CheckpointError(f"train.resume={mode} is a run directory, not a checkpoint: pass one of its "
                                  f"checkpoints ({inside[-1]}), or --resume alone for the newest valid one of "
                                  "train.output_dir")
        return read_checkpoint(path)
    candidates = list_checkpoints(out)[::-1]
    if not candidates:
        print(f"grpo: train.resume=auto: no checkpoint in {out} yet; starting at step 0", file=sys.stderr)
        return None
    skipped = []
    for path in candidates:
        try:
            found = read_checkpoint(path)
        except CheckpointError as e:
            skipped.append((path, str(e)))
            continue
        found.skipped = skipped
        return found
    raise CheckpointError(f"train.resume=auto: no valid checkpoint in {out} ({'; '.join(why for _, why in skipped)})")


def _read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """The tensors of a save_pretrained directory (one file or an index of shards)."""
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(directory / shard)).items()}
    if not (directory / "model.safetensors").is_file():
        raise CheckpointError(f"{directory.name}: no model.safetensors (or index) to resume the policy from")
    return load_file(str(directory / "model.safetensors"))


def load_policy_weights(model: torch.nn.Module, directory: Path) -> None:
    """Copy the checkpoint's policy weights (full model or LoRA adapter) into `model`, exactly."""
    from grpo.modeling.lora import is_lora

    if is_lora(model):
        if not (directory / "adapter_config.json").is_file():
            raise CheckpointError(f"{directory.name}: holds no LoRA adapter, cannot resume a LoRA run from it")
        from peft.utils import load_peft_weights, set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_peft_weights(str(directory), device="cpu"))
        if result.unexpected_keys:
            raise CheckpointError(f"{directory.name}: adapter does not fit the model ({result.unexpected_keys[0]})")
        return
    weights = _read_safetensors(directory)
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"{directory.name}: weights do not fit the model "
                              f"({str(e).strip().splitlines()[-1].strip()})") from None
    current = model.state_dict()
    loaded = {current[k].data_ptr() for k in weights if k in current}
    untied = [k for k in missing if current[k].data_ptr() not in loaded]   # tied copies are fine
    if untied or unexpected:
        raise CheckpointError(f"{directory.name}: weights do not fit the model "
                              f"({'missing ' + untied[0] if untied else 'unexpected ' + unexpected[0]})")


def restore(state: TrainState, ckpt: Checkpoint, cfg: Config) -> None:
    """Put every piece of `state` where the checkpoint left it (generators last)."""
    load_policy_weights(state.model, ckpt.path)
    ref_module = refreshed_reference(state, cfg)
    if ref_module is not None:
        from safetensors.torch import load_model

        if not (ckpt.path / "reference.safetensors").is_file():
            raise CheckpointError(f"{ckpt.path.name}: no reference.safetensors, needed with algorithm.ref_update_steps")
        load_model(ref_module, str(ckpt.path / "reference.safetensors"))
    state.optimizer.state.clear()         # the zeros build_optimizer made up front: not beside the loaded state
    state.optimizer.load_state_dict(ckpt.optim["optimizer"])
    if ckpt.optim.get("scheduler") is not None:
        state.scheduler.load_state_dict(ckpt.optim["scheduler"])
    if ckpt.optim.get("loss_scaler") and cfg.train.precision == "fp16":   # the scale goes on where it was
        from grpo.modeling.precision import loss_scaler

        loss_scaler(state.optimizer, next(state.model.parameters()).device).load_state_dict(ckpt.optim["loss_scaler"])
    apply_optimizer_settings(state.optimizer, state.scheduler, cfg, ckpt.trainer_state.get("config") or {})
    state.stream.load_state_dict(ckpt.rng["stream"])
    for extra in state.extras:            # e.g. the reward model retrained by reward.reward_model_update
        extra.load(ckpt.path)
    restore_rng(ckpt.rng)                 # sampling is keyed by (seed, stream position): nothing more to restore


def config_changes(saved: dict[str, Any], cfg: Config) -> list[str]:
    """`key: old -> new` for every config value that differs from the checkpoint's (neutral keys aside)."""
    old, new = flat_config(saved), flat_config(to_dict(cfg))     # older runs' flat variant keys nested
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
            if k not in NEUTRAL_KEYS and old.get(k) != new.get(k)]


def check_resumable(ckpt: Checkpoint, cfg: Config) -> None:
    """Errors and warnings about resuming `ckpt` under `cfg` (before anything is written)."""
    if ckpt.step > cfg.train.max_steps:
        raise ConfigError(f"{ckpt.path} is at step {ckpt.step}, past train.max_steps={cfg.train.max_steps}")
    saved = ckpt.trainer_state.get("config") or {}
    refuse_changes(saved, cfg, ckpt.path)                 # keys baked into the checkpoint (grpo/state/resume_config.py)
    changes = config_changes(saved, cfg)
    if changes:
        log.warning("warning: resuming %s with a changed config, applied from step %d on (%s); the result will "
                    "differ from an uninterrupted run", ckpt.path.name, ckpt.step + 1, "; ".join(changes))
    threads = ckpt.trainer_state.get("num_threads")
    if threads and threads != torch.get_num_threads():
        log.warning("warning: %s was written with %s torch threads, this run uses %s: results may differ in the "
                    "last bits (set cpu.num_threads)", ckpt.path.name, threads, torch.get_num_threads())


def set_aside(path: Path) -> Path:
    """Rename an invalid checkpoint to checkpoint-<step>.invalid (never chosen again, kept for inspection)."""
    target = path.with_name(f"{path.name}.invalid")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(path, target)
    return target


def previous_run(out: Path, cfg: Config) -> str | None:
    """What of an earlier run `out` holds (its newest checkpoint, or its non-empty metrics file), or None."""
    checkpoints = list_checkpoints(out)
    if checkpoints:
        return f"newest checkpoint: {checkpoints[-1].name}"
    metrics = out / cfg.log.metrics_file
    return f"{metrics.name} with records" if metrics.is_file() and metrics.stat().st_size > 0 else None


def announce_run(out: Path, cfg: Config, ckpt: Checkpoint | None) -> int:
    """Say what the run will do (resume from where, which invalid checkpoints it sets aside, that it
    starts over in a used directory) without writing anything; returns the first step to train. A new run
    (no checkpoint to resume) in a directory holding an earlier one is a ConfigError unless
    train.overwrite_output_dir."""
    start = 0 if ckpt is None else ckpt.step
    for path, why in ([] if ckpt is None else ckpt.skipped):
        log.warning("warning: %s; resuming from %s (the invalid one is kept as %s.invalid)", why, ckpt.path.name,
                    path.name)
    held = previous_run(out, cfg) if ckpt is None and cfg.train.resume.strip() == "never" else None   # auto: a run
    # killed before its first checkpoint is started over, as documented (job scripts always pass --resume)
    if held and not cfg.train.overwrite_output_dir:
        raise ConfigError(f"{out} already holds a run ({held}): continue it (--resume; Python API: "
                          f"train(resume_from_checkpoint=True)), start over there (train.overwrite_output_dir: true; "
                          f"Python API / TRL: overwrite_output_dir=True), or choose another train.output_dir")
    if held:
        log.warning("warning: %s holds a run (%s); train.overwrite_output_dir: its checkpoints are deleted and its "
                    "metrics emptied once step 1 succeeds", out, held)
    if ckpt is not None:
        print(f"grpo: resuming from {ckpt.path} (step {start} of {cfg.train.max_steps})", file=sys.stderr)
    return start + 1


def begin_run(out: Path, cfg: Config, ckpt: Checkpoint | None) -> None:
    """Commit to the run: the first change to output_dir, made once the first step's experience and
    update have succeeded (so a run failing before that leaves an existing directory as it was).
    Sets aside invalid checkpoints, clears leftovers of interrupted writes, writes config.yaml and cuts
    metrics.jsonl, alerts.jsonl and samples.jsonl back to the records of the checkpoint's steps."""
    for path, _ in ([] if ckpt is None else ckpt.skipped):
        set_aside(path)
    if ckpt is None and cfg.train.overwrite_output_dir and cfg.train.resume.strip() == "never":   # starting over:
        for path in list_checkpoints(out):          # no checkpoint of the old run stays to be resumed into the new one's
            shutil.rmtree(path)
    remove_stale_temporaries(out)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    for name in (cfg.log.metrics_file, ALERTS_FILE, SAMPLES_FILE):                # steps after it are redone
        truncate_metrics(out / name, 0 if ckpt is None else ckpt.step)

