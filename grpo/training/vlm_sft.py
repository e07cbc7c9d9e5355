"""Cold-start SFT of the tiny vision-language model on the shapes VQA task, and its held-out evaluation.

    python -m grpo.training.vlm_sft --out grpo/assets/shapes-vqa-sft --steps 300 --batch-size 32 --lr 2e-3 --seed 0

(the command line is grpo/cli/sft.py's vlm_main; the loop is the one SFT loop, grpo.training.sft.sft_steps)

The loss is grpo.training.sft's: next-token cross-entropy on the completion (+ eos) tokens only (build_batch's
labels); the prompt, its ``<image>`` placeholders included, carries none. Each forward gets the batch's
pixel_values. Evaluation is grpo.training.evaluate's (the native engine, grpo/rollout/engines/native.py, with the
pixel values as model_inputs), greedy or at a temperature, scored with shapes_vqa.accuracy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from grpo.algorithms.schedule import lr_factor
from grpo.data.tasks import shapes_vqa
from grpo.modeling.vlm import build_image_processor, build_vlm, build_vlm_tokenizer, load_vlm, vision_rows
from grpo.rewards.text import answer_block, think_answer_parts
from grpo.training.evaluate import TextMetrics, generate_texts
from grpo.training.evaluate import evaluate as evaluate_rows
from grpo.training.sft import IGNORE_INDEX, build_batch, sft_steps


def vlm_sft_loss(model, tokenizer, rows: list[dict], worked: list[bool] | None = None) -> torch.Tensor:
    """Mean completion cross-entropy of vision rows (prompts expanded, pixel_values attached: vision_rows);
    `worked[i]`: row i's demonstration describes the scene first (default: all do). Shape: B rows -> scalar."""
    device = next(model.parameters()).device
    worked = [True] * len(rows) if worked is None else worked
    batch = build_batch(tokenizer, [r["prompt"] for r in rows],
                        [shapes_vqa.demonstration(r, w) for r, w in zip(rows, worked)])
    pixels = torch.stack([r["pixel_values"] for r in rows]).to(device)                   # [B, 3, H, W]
    logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                   pixel_values=pixels).logits                                          # [B, L, V]
    labels = batch["labels"][:, 1:].to(device)                                          # [B, L - 1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def answer(model, tokenizer, rows: list[dict], temperature: float = 0.0, num_generations: int = 1,
           max_new_tokens: int = 24, batch_size: int = 64, seed: int = 0) -> list[str]:
    """Completions of vision rows through the native engine (grpo/rollout/engine.py; num_generations per row,
    row-major), the pixel values as model_inputs: grpo.training.evaluate's decoding."""
    return generate_texts(model, tokenizer, rows, max_new_tokens=max_new_tokens, batch_size=batch_size,
                          temperature=temperature, seed=seed, num_samples=num_generations)


def vqa_metrics(texts: list[str], expanded: list[dict]) -> dict:
    """Accuracy (and per question type), the mode statistics and an example, of completions of vision rows
    (one row per completion)."""
    per_type = {q: shapes_vqa.accuracy([t for t, r in zip(texts, expanded) if r["qtype"] == q],
                                       [r for r in expanded if r["qtype"] == q]) for q in shapes_vqa.QUESTIONS}
    return {"accuracy": shapes_vqa.accuracy(texts, expanded), "per_type": per_type, "n": len(texts),
            **mode_stats(texts, expanded), "example": texts[0] if texts else ""}


def evaluate(model, tokenizer, rows: list[dict], temperature: float = 0.0, num_generations: int = 1,
             seed: int = 0, max_new_tokens: int = 24) -> dict:
    """Held-out accuracy (and per question type) of vision rows: grpo.training.evaluate.evaluate with
    :func:`vqa_metrics` as its summary."""
    return evaluate_rows(model, tokenizer, rows, [], max_new_tokens=max_new_tokens, temperature=temperature,
                         seed=seed, num_samples=num_generations, summary=TextMetrics(vqa_metrics))


def is_worked(completion: str) -> bool:
    """True when the completion describes something in ``<think>`` before answering (the worked mode);
    False for an empty or whitespace-only reasoning (the direct mode) or a malformed completion."""
    parts = think_answer_parts(completion)
    return parts is not None and parts[0].strip() != ""


def mode_stats(texts: list[str], rows: list[dict]) -> dict:
    """Share of worked completions and the accuracy of each mode (None when a mode never occurs)."""
    worked = [is_worked(t) for t in texts]
    right = [answer_block(t) == r["answer"] for t, r in zip(texts, rows)]

    def acc(mode: bool):
        hits = [ok for ok, w in zip(right, worked) if w == mode]
        return float(np.mean(hits)) if hits else None
    return {"worked_share": float(np.mean(worked)) if texts else 0.0, "worked_accuracy": acc(True),
            "direct_accuracy": acc(False)}


def run_vlm_sft(steps: int, batch_size: int, lr: float, seed: int = 0, num_examples: int = 4000,
                image_size: int = shapes_vqa.IMAGE_SIZE, log_every: int = 50, size: dict | None = None,
                worked_fraction: float = 1.0, qtypes: tuple[str, ...] = tuple(shapes_vqa.QUESTIONS),
                patch_size: int = 8, direct_noise: float = 0.0, init: str | Path | None = None):
    """Build the tiny VLM and train it `steps` AdamW steps on demonstrations, a share `worked_fraction` of
    them worked (the others direct, fixed per example), question types drawn from `qtypes` (repeat a name to
    weight it). `direct_noise`: the share of direct demonstrations whose answer comes from a noisy teacher
    that guesses without looking (shapes_vqa.guess_answer; fixed per example); worked ones are always right.
    `init`: continue from a saved VLM (grpo.modeling.vlm.save_vlm's directory) instead of a fresh one
    (image_size, size and patch_size are then the saved model's). Returns (model, tokenizer, processor, log).
    Linear warm-up (5%) then cosine decay to 10% (grpo.algorithms.schedule)."""
    if init is not None:
        model, tokenizer, processor = load_vlm(init)
        torch.manual_seed(seed)
    else:
        tokenizer = build_vlm_tokenizer(shapes_vqa.WORDS)
        processor = build_image_processor(image_size)
        model = build_vlm(tokenizer, image_size=image_size, patch_size=patch_size, seed=seed, size=size)
    rows = vision_rows(shapes_vqa.generate("train", num_examples, seed=seed, size=image_size, qtypes=qtypes), processor, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup_steps=warmup, total_steps=steps, kind="cosine", min_ratio=0.1))
    rng = np.random.default_rng(seed)
    order, log, t0 = rng.permutation(len(rows)), [], time.perf_counter()
    worked = rng.random(len(rows)) < worked_fraction                                    # [num_examples] bool
    if direct_noise > 0:
        noisy = (rng.random(len(rows)) < direct_noise) & ~worked                        # [num_examples] bool
        rows = [{**r, "answer": shapes_vqa.guess_answer(r, rng)} if n else r for r, n in zip(rows, noisy)]
    model.train()

    def backward(step: int) -> float:
        idx = [order[(step * batch_size + i) % len(rows)] for i in range(batch_size)]
        loss = vlm_sft_loss(model, tokenizer, [rows[i] for i in idx], [bool(worked[i]) for i in idx])
        loss.backward()
        return float(loss.detach())

    for done in sft_steps(optimizer, scheduler, range(steps), backward, list(model.parameters())):
        if (done.step + 1) % log_every == 0 or done.step == 0:
            log.append({"step": done.step + 1, "loss": done.loss, "s": round(time.perf_counter() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
    model.eval()
    return model, tokenizer, processor, log


if __name__ == "__main__":                # python -m grpo.training.vlm_sft: the command line's VLM SFT
    from grpo.cli.sft import vlm_main

    raise SystemExit(vlm_main())
