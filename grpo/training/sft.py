"""Supervised fine-tuning (SFT): the one SFT loop, the text batch, and the embedded cold start.

:func:`sft_steps` is the loop of every SFT in the package: this module's cold start (text and tool
episodes), grpo/training/finetune.py (any model on any dataset) and grpo/training/vlm_sft.py (the tiny
vision-language model). What differs per kind is its input: how a step's batch is built and its loss
masked (a `backward(step)` function), the optimizer and schedule, and what is logged or saved per step.

``run_sft`` trains a freshly built policy (see :mod:`grpo.modeling.models`) on a mix of
*worked* and *direct* arithmetic demonstrations (see
:mod:`grpo.data.tasks.arithmetic`) and saves it with ``save_pretrained``.  The loss
covers completion tokens (and the closing eos) only.  The result is the base
policy that GRPO then improves.

The command line (``grpo sft`` without a dataset, ``python -m grpo.training.sft``) is grpo/cli/sft.py.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from grpo.modeling.models import build_model, build_tokenizer
from grpo.algorithms.schedule import lr_factor
from grpo.data.tasks import arithmetic
from grpo.training.evaluate import TextMetrics, evaluate

IGNORE_INDEX = -100


def build_batch(tokenizer, prompts: list[str], completions: list[str], add_eos: bool = True) -> dict:
    """Right-padded tensors for ``prompt + completion (+ eos)``.

    ``labels`` equal ``input_ids`` on completion (and eos) positions and
    ``IGNORE_INDEX`` on prompt and padding positions, so only the completion
    is learned.  Returns ``input_ids``, ``attention_mask``, ``labels``.
    """
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if add_eos else []
    sequences = [p + c + eos for p, c in zip(prompt_ids, completion_ids)]
    width = max(len(s) for s in sequences)
    # built on the host (row by row); completion_loss moves them to the model's device
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long, device="cpu")
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long, device="cpu")
    labels = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long, device="cpu")
    spans = observation_tags(tokenizer)
    for row, (p, seq) in enumerate(zip(prompt_ids, sequences)):
        input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long, device="cpu")
        attention_mask[row, : len(seq)] = 1
        labels[row, len(p) : len(seq)] = torch.tensor(seq[len(p) :], dtype=torch.long, device="cpu")
        if spans is not None:                         # tool responses are read, not written (as in GRPO's loss)
            inside = False
            for i in range(len(p), len(seq)):
                inside = inside or seq[i] == spans[0]
                if inside:
                    labels[row, i] = IGNORE_INDEX
                    inside = seq[i] != spans[1]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def observation_tags(tokenizer) -> tuple[int, int] | None:
    """The ids of ``<tool_response>`` and ``</tool_response>`` when both are single tokens (the tool-use
    tokenizer), whose spans SFT leaves out of the loss; None otherwise."""
    ids = tokenizer.convert_tokens_to_ids(["<tool_response>", "</tool_response>"])
    return None if any(i is None or i == tokenizer.unk_token_id for i in ids) else (ids[0], ids[1])


def completion_loss(model, batch: dict, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy over positions whose label is not ignored (``"mean"`` or ``"sum"``)."""
    device = next(model.parameters()).device
    logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)).logits
    shift_logits = logits[:, :-1].reshape(-1, logits.size(-1)).float()
    shift_labels = batch["labels"][:, 1:].reshape(-1).to(device)
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=IGNORE_INDEX, reduction=reduction)


def length_buckets(lengths: list[int], width: int = 8) -> list[list[int]]:
    """Group indices whose lengths fall in the same ``width``-token bucket (less padding per forward)."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n // width, []).append(i)
    return [groups[k] for k in sorted(groups)]


def sft_step_loss(model, tokenizer, prompts: list[str], completions: list[str]) -> float:
    """Backpropagate the mean completion loss of one batch, one forward per length bucket.

    Equivalent to ``completion_loss`` on the whole (padded) batch, but short
    direct demonstrations are not padded to the length of worked ones.
    Returns the loss value; gradients are accumulated into ``model``.
    """
    lengths = [len(ids) for ids in tokenizer([p + c for p, c in zip(prompts, completions)], add_special_tokens=False)["input_ids"]]
    buckets = length_buckets(lengths)
    batches = [build_batch(tokenizer, [prompts[i] for i in b], [completions[i] for i in b]) for b in buckets]
    n_tokens = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
    total = 0.0
    for batch in batches:
        loss = completion_loss(model, batch, reduction="sum") / n_tokens
        loss.backward()
        total += loss.item()
    return total


@dataclass
class SftStep:
    """What one step of :func:`sft_steps` did."""

    step: int
    loss: float                       # the step's loss, as `backward` returned it
    lr: float                         # the learning rate the step used
    grad_norm: float                  # before clipping
    seconds: float


def sft_steps(optimizer, scheduler, steps: Iterable[int], backward: Callable[[int], float], params: list,
              max_grad_norm: float = 1.0) -> Iterator[SftStep]:
    """The SFT loop: for each step, gradients cleared, ``backward(step)`` (the kind's batch, its masked loss,
    backpropagated; returns the loss), clipped to `max_grad_norm`, one optimizer and schedule step. Yields
    each step's :class:`SftStep`, so the caller logs and saves as its kind does."""
    for step in steps:
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = backward(step)
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        yield SftStep(step, loss, lr, norm, time.perf_counter() - t0)


def lr_lambda(warmup_steps: int, total_steps: int, min_ratio: float = 0.1):
    """Linear warmup then cosine decay to ``min_ratio`` of the peak rate (grpo.algorithms.schedule)."""
    return functools.partial(lr_factor, warmup_steps=warmup_steps, total_steps=total_steps, kind="cosine",
                             min_ratio=min_ratio)


def run_sft(
    out_dir,
    *,
    steps: int = 1000,
    batch_size: int = 64,
    lr: float = 2e-3,
    worked_fraction: float = 0.45,
    seed: int = 0,
    size: str = "small",
    num_examples: int = 40_000,
    warmup_steps: int | None = None,
    weight_decay: float = 0.01,
    log_every: int = 50,
    spec: arithmetic.TaskSpec = arithmetic.DEFAULT_SPEC,
    log=print,
    task: str = "arithmetic",
) -> dict:
    """Train a fresh ``size`` policy on demonstrations of the embedded `task` and save it to ``out_dir``:
    arithmetic (``worked_fraction`` worked solutions), or calculator (``worked_fraction`` tool episodes,
    the tool-use tokenizer; observation tokens are learned as text here, the cold start only needs the form).

    Returns ``{"final_loss", "first_loss", "steps", "wall_seconds", "num_parameters"}``
    (``final_loss`` averages the last ``log_every`` steps).
    """
    torch.manual_seed(seed)
    if task == "calculator":
        from grpo.data.tasks import calculator
        from grpo.modeling.models import TOOL_TAG_TOKENS

        tokenizer = build_tokenizer(extra_tags=TOOL_TAG_TOKENS)
        rows = calculator.sft_examples(num_examples, seed=seed, tool_fraction=worked_fraction)
    else:
        tokenizer = build_tokenizer()
        rows = arithmetic.sft_examples(num_examples, seed=seed, worked_fraction=worked_fraction, spec=spec)
    model = build_model(tokenizer, size=size, seed=seed)
    model.train()
    prompts = [r["prompt"] for r in rows]
    completions = [r["completion"] for r in rows]
    warmup = warmup_steps if warmup_steps is not None else max(1, steps // 20)
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 or "norm" in name else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup, steps))
    generator = torch.Generator(device="cpu").manual_seed(seed)       # host-side: the data order
    order = torch.randperm(len(rows), generator=generator, device="cpu").tolist()
    cursor, recent, first_loss = 0, [], None
    n_params = sum(p.numel() for p in model.parameters())
    log(f"sft: {size} model, {n_params:,} parameters, {len(rows)} examples, worked_fraction={worked_fraction}")
    start = time.perf_counter()

    def backward(step: int) -> float:
        nonlocal order, cursor
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(len(rows), generator=generator, device="cpu").tolist(), 0
        idx = order[cursor : cursor + batch_size]
        cursor += batch_size
        return sft_step_loss(model, tokenizer, [prompts[i] for i in idx], [completions[i] for i in idx])

    for done in sft_steps(optimizer, scheduler, range(1, steps + 1), backward, list(model.parameters())):
        step, value = done.step, done.loss
        first_loss = value if first_loss is None else first_loss
        recent = (recent + [value])[-max(1, log_every) :]
        if log_every and (step % log_every == 0 or step == steps):
            elapsed = time.perf_counter() - start
            log(f"step {step:5d}/{steps}  loss {sum(recent) / len(recent):.4f}  lr {scheduler.get_last_lr()[0]:.2e}  {elapsed:6.1f}s")
    wall = time.perf_counter() - start
    model.eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log(f"sft: saved to {out} after {wall:.1f}s")
    return {
        "final_loss": sum(recent) / len(recent),
        "first_loss": first_loss,
        "steps": steps,
        "wall_seconds": wall,
        "num_parameters": n_params,
    }


# --------------------------------------------------------------------------- evaluation


def score_completions(completions: list[str], answers: list[str]) -> dict:
    """Accuracy, format rate, worked share and per-style accuracy of ``completions``."""
    correct = [arithmetic.is_correct(c, a) for c, a in zip(completions, answers)]
    worked = [arithmetic.is_worked(c) for c in completions]
    n, n_worked = len(completions), sum(worked)
    n_direct = n - n_worked

    def rate(k: int, d: int) -> float:
        return k / d if d else float("nan")

    return {
        "n": n,
        "accuracy": rate(sum(correct), n),
        "format": rate(sum(arithmetic.format_ok(c) for c in completions), n),
        "worked_share": rate(n_worked, n),
        "worked_accuracy": rate(sum(c for c, w in zip(correct, worked) if w), n_worked),
        "direct_accuracy": rate(sum(c for c, w in zip(correct, worked) if not w), n_direct),
    }


def evaluate_greedy(model, tokenizer, rows: list[dict], batch_size: int = 128, max_new_tokens: int = 40) -> dict:
    """Greedy (``do_sample=False``) metrics on ``rows`` of ``{"prompt", "answer"}`` (grpo.training.evaluate)."""
    scores = TextMetrics(lambda texts, expanded: score_completions(texts, [r["answer"] for r in expanded]))
    return evaluate(model, tokenizer, rows, [], max_new_tokens=max_new_tokens, batch_size=batch_size, summary=scores)


def evaluate_sampled(
    model, tokenizer, rows: list[dict], num_samples: int = 4, temperature: float = 1.0,
    batch_size: int = 128, max_new_tokens: int = 40, seed: int = 0,
) -> dict:
    """Sampled metrics over ``num_samples`` completions per row, plus ``pass_at_k`` (k = ``num_samples``)."""

    def metrics(completions: list[str], expanded: list[dict]) -> dict:
        answers = [r["answer"] for r in expanded]
        stats = score_completions(completions, answers)
        hits = [arithmetic.is_correct(c, a) for c, a in zip(completions, answers)]
        groups = [hits[i : i + num_samples] for i in range(0, len(hits), num_samples)]
        stats["pass_at_k"] = sum(any(g) for g in groups) / max(1, len(groups))
        return stats

    return evaluate(model, tokenizer, rows, [], max_new_tokens=max_new_tokens, batch_size=batch_size,
                    temperature=temperature, seed=seed, num_samples=num_samples, summary=TextMetrics(metrics))


if __name__ == "__main__":                # python -m grpo.training.sft: the command line's cold start
    from grpo.cli.sft import cold_start_main

    raise SystemExit(cold_start_main())
