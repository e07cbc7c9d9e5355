"""Supervised fine-tuning (SFT) of any causal LM on any dataset: the cold start and the rejection-sampling
SFT stages of DeepSeek-R1, through the one SFT loop (grpo.training.sft.sft_steps). (`grpo sft` without a dataset
builds the embedded cold start: grpo/training/sft.py.)

Rows are ``prompt`` + ``completion`` columns (a string prompt, or chat messages rendered with the
tokenizer's chat template and the generation prompt), or a ``messages`` column: the conversation up to the
last assistant message is the prompt, that message the completion. The loss is the mean next-token
cross-entropy over completion tokens (and the closing EOS) only. The run uses the config tree of
``grpo train``: ``model.*``, ``lora.*``, ``optim.*`` (the one LR schedule, grpo.algorithms.schedule),
``train.max_steps / seed / save_steps / save_total_limit / output_dir / resume``, ``train.micro_batch_size``
(sequences per step; 0 = 16) and ``log.*``; metrics.jsonl holds ``loss/sft``, ``optim/lr``,
``optim/grad_norm``, ``time/step_s``. Checkpoints are those of GRPO; ``train.resume: auto`` continues
from the newest with the same data order (the epoch permutation is keyed by the seed). As in grpo train,
the run holds the output directory's lock, and a directory that already holds a run is refused unless
``--resume`` (an SFT run) or ``train.overwrite_output_dir`` (start over); a GRPO run's directory is
refused for --resume too.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from grpo.config import Config, ConfigError
from grpo.data.prompts import encode_prompts
from grpo.state.checkpoint import list_checkpoints, save_checkpoint, verify_checkpoint
from grpo.state.metrics import MetricsLogger, truncate_metrics
from grpo.state.output_dir import OutputDirLock, prepare_output_dir
from grpo.state.resume import load_policy_weights, previous_run
from grpo.training.sft import IGNORE_INDEX, completion_loss, sft_steps
from grpo.training.update import build_optimizer

DEFAULT_BATCH = 16
log = logging.getLogger(__name__)


def split_row(row: dict[str, Any], where: str) -> tuple[Any, str]:
    """(prompt, completion) of one SFT row; a one-line ConfigError naming `where` otherwise."""
    if "messages" in row and "completion" not in row:
        messages = row["messages"]
        last = max((i for i, m in enumerate(messages or []) if isinstance(m, dict) and m.get("role") == "assistant"),
                   default=None)
        if last is None:
            raise ConfigError(f"{where}: 'messages' has no assistant message to learn")
        return list(messages[:last]), str(messages[last].get("content") or "")
    if "prompt" not in row or "completion" not in row:
        raise ConfigError(f"{where}: an SFT row needs 'prompt' and 'completion' columns, or 'messages'")
    completion = row["completion"]
    if not isinstance(completion, str):
        raise ConfigError(f"{where}: column 'completion' must be text, got {type(completion).__name__} {completion!r}")
    return row["prompt"], completion


def encode_rows(tokenizer, rows: list[dict[str, Any]], system_prompt: str | None = None, source: str = "dataset",
                template_kwargs: dict[str, Any] | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids + EOS) of every row: prompts rendered as in GRPO (chat template for
    message lists), completions tokenized without special tokens."""
    pairs = [split_row(r, f"{source} row {i + 1}") for i, r in enumerate(rows)]
    chat = any(isinstance(p, list) for p, _ in pairs)
    prompt_ids = encode_prompts(tokenizer, [p for p, _ in pairs], system_prompt, chat, None, template_kwargs)
    completion_ids = tokenizer([c for _, c in pairs], add_special_tokens=False)["input_ids"]
    return [(p, c + [tokenizer.eos_token_id]) for p, c in zip(prompt_ids, completion_ids)]


def batch_of(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels (IGNORE_INDEX on prompt and padding)."""
    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE_INDEX)
    for r, (p, c) in enumerate(pairs):
        seq = p + c
        ids[r, :len(seq)] = torch.tensor(seq, device="cpu")
        mask[r, :len(seq)] = 1
        labels[r, len(p):len(seq)] = torch.tensor(c, device="cpu")
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def order_at(n: int, seed: int, position: int) -> list[int]:
    """Row indices from sample `position` on, for one more step's worth of epochs: epoch e is the
    permutation keyed by (seed, e), so the order does not depend on where a run resumed."""
    epoch = position // n
    g = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g, device="cpu").tolist()
    return perm[position % n:]


def next_batch(n: int, seed: int, position: int, size: int) -> list[int]:
    out: list[int] = []
    while len(out) < size:
        out += order_at(n, seed, position + len(out))[:size - len(out)]
    return out


def run_finetune(cfg: Config, model, tokenizer, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """SFT for train.max_steps steps; returns {"steps", "first_loss", "final_loss", "checkpoint"}."""
    tc = cfg.train
    pairs = encode_rows(tokenizer, rows, cfg.data.system_prompt, cfg.data.dataset or "dataset",
                        dict(cfg.data.chat_template_kwargs))
    out = prepare_output_dir(tc.output_dir)
    with OutputDirLock(out):                       # a live run there (GRPO or SFT) is refused, naming it
        return _run(cfg, model, tokenizer, pairs, out)


def checkpoint_kind(path: Path) -> str:
    """'sft' for a checkpoint of this module, else the kind of run that wrote it (GRPO's has no 'kind')."""
    try:
        return str(json.loads((path / "trainer_state.json").read_text()).get("kind", "grpo"))
    except (OSError, ValueError, AttributeError):
        return "unknown"


def sft_checkpoints(out: Path, cfg: Config) -> list[Path]:
    """The SFT checkpoints of `out` to resume from, after refusing (ConfigError, nothing touched) an output
    directory of another kind of run, or of an earlier run without --resume, as grpo train does; with
    train.overwrite_output_dir the earlier run's checkpoints and metrics are removed instead."""
    tc = cfg.train
    checkpoints = list_checkpoints(out)
    other = [c.name for c in checkpoints if checkpoint_kind(c) != "sft"]
    if (out / "config.yaml").is_file():
        other.append("config.yaml")
    if other and not tc.overwrite_output_dir:
        raise ConfigError(f"train.output_dir {out} holds another kind of run (a GRPO run: {other[0]}), not an SFT "
                          f"run: choose another --output-dir")
    held = previous_run(out, cfg)
    if tc.overwrite_output_dir:
        if held or other:
            log.warning("warning: %s holds a run (%s); train.overwrite_output_dir: starting over", out, held)
            for path in checkpoints:
                shutil.rmtree(path)
            truncate_metrics(out / cfg.log.metrics_file, 0)
        return []
    if tc.resume == "never" and held:
        raise ConfigError(f"{out} already holds an SFT run ({held}): pass --resume to continue it, set "
                          f"train.overwrite_output_dir: true to start over there, or choose another --output-dir")
    if tc.resume != "never" and not checkpoints:
        truncate_metrics(out / cfg.log.metrics_file, 0)    # a run stopped before its first checkpoint: redone
    return checkpoints if tc.resume != "never" else []


def _run(cfg: Config, model, tokenizer, pairs: list[tuple[list[int], list[int]]], out: Path) -> dict[str, Any]:
    tc = cfg.train
    size = tc.micro_batch_size or DEFAULT_BATCH
    done = sft_checkpoints(out, cfg)
    optimizer, scheduler = build_optimizer(model, cfg.optim, tc.max_steps)
    start = 0
    if done:
        ckpt = done[-1] if tc.resume == "auto" else Path(tc.resume)
        step = int(ckpt.name.split("-")[1])
        if step > tc.max_steps:
            raise ConfigError(f"{ckpt} is at step {step}, past train.max_steps={tc.max_steps} (--max-steps)")
        if step == tc.max_steps:                                   # finished already: nothing to redo
            return {"steps": step, "first_loss": float("nan"), "final_loss": float("nan"), "checkpoint": ckpt}
        verify_checkpoint(ckpt)
        load_policy_weights(model, ckpt)
        saved = torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu")
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        start = int(ckpt.name.split("-")[1])
        truncate_metrics(out / cfg.log.metrics_file, start)        # steps after the checkpoint are redone
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    first = last = float("nan")
    checkpoint = None

    def backward(step: int) -> float:
        batch = batch_of([pairs[i] for i in next_batch(len(pairs), tc.seed, (step - 1) * size, size)],
                         tokenizer.pad_token_id)
        loss = completion_loss(model, {k: v.to(device) for k, v in batch.items()})
        loss.backward()
        return float(loss.detach())

    model.train()
    with MetricsLogger(out / cfg.log.metrics_file, tc.max_steps, cfg.log.progress_bar, initial=start, config=cfg) as log:
        for done in sft_steps(optimizer, scheduler, range(start + 1, tc.max_steps + 1), backward, params,
                              cfg.optim.max_grad_norm or float("inf")):
            step, last = done.step, done.loss
            first = last if step == start + 1 else first
            log.log({"step": step, "loss/sft": last, "optim/lr": done.lr, "optim/grad_norm": done.grad_norm,
                     "time/step_s": done.seconds})
            if (tc.save_steps and step % tc.save_steps == 0) or step == tc.max_steps:
                log.sync()
                checkpoint = save_checkpoint(out, step, model, tokenizer, optimizer=optimizer, scheduler=scheduler,
                                             state={"kind": "sft"}, save_total_limit=tc.save_total_limit)
    model.eval()
    return {"steps": tc.max_steps, "first_loss": first, "final_loss": last, "checkpoint": checkpoint}
