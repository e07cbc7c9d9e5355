"""Cold-start SFT of the tiny vision-language model on the shapes VQA task, and its held-out evaluation.

    python -m grpo.training.vlm_sft --out grpo/assets/shapes-vqa-sft --steps 300 --batch-size 32 --lr 2e-3 --seed 0

The loss is grpo.training.sft's: next-token cross-entropy on the completion (+ eos) tokens only (build_batch's
labels); the prompt, its ``<image>`` placeholders included, carries none. Each forward gets the batch's
pixel_values. Evaluation samples through the trainer's own rollout (the native engine, grpo/rollout/engines/native.py, with the pixel values
as model_inputs), greedy or at a temperature, and scores with shapes_vqa.accuracy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from grpo.algorithms.schedule import lr_factor
from grpo.data.prompts import tokenize_prompts
from grpo.data.tasks import shapes_vqa
from grpo.modeling.vlm import (build_image_processor, build_vlm, build_vlm_tokenizer, load_vlm, save_vlm,
                               vision_rows)
from grpo.rewards.text import answer_block, think_answer_parts
from grpo.rollout.engines.native import NativeEngine
from grpo.rollout.params import SamplingParams
from grpo.rollout.eos import eos_token_ids
from grpo.training.experience import decode_completions
from grpo.training.sft import IGNORE_INDEX, build_batch


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


@torch.no_grad()
def answer(model, tokenizer, rows: list[dict], temperature: float = 0.0, num_generations: int = 1,
           max_new_tokens: int = 24, batch_size: int = 64, seed: int = 0) -> list[str]:
    """Completions of vision rows through the native engine (grpo/rollout/engine.py; num_generations per row,
    row-major)."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(rows), batch_size):
        part = rows[start:start + batch_size]
        batch = tokenize_prompts(tokenizer, part, device)                                # pixel_values -> model_inputs
        index = torch.arange(start, start + len(part), device=device)
        params = SamplingParams(n=num_generations, temperature=temperature, max_tokens=max_new_tokens,
                                stop_token_ids=eos_token_ids(tokenizer, model), seed=seed)
        gen = NativeEngine(model, tokenizer.pad_token_id).generate(batch.prompt_ids, batch.prompt_mask, params,
                                                                   prompt_index=index, model_inputs=batch.model_inputs)
        out += decode_completions(tokenizer, gen)
    return out


def evaluate(model, tokenizer, rows: list[dict], temperature: float = 0.0, num_generations: int = 1,
             seed: int = 0, max_new_tokens: int = 24) -> dict:
    """Held-out accuracy (and per question type) of vision rows."""
    texts = answer(model, tokenizer, rows, temperature, num_generations, max_new_tokens, seed=seed)
    expanded = [r for r in rows for _ in range(num_generations)]
    per_type = {q: shapes_vqa.accuracy([t for t, r in zip(texts, expanded) if r["qtype"] == q],
                                       [r for r in expanded if r["qtype"] == q]) for q in shapes_vqa.QUESTIONS}
    return {"accuracy": shapes_vqa.accuracy(texts, expanded), "per_type": per_type, "n": len(texts),
            **mode_stats(texts, expanded), "example": texts[0] if texts else ""}


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
    for step in range(steps):
        idx = [order[(step * batch_size + i) % len(rows)] for i in range(batch_size)]
        loss = vlm_sft_loss(model, tokenizer, [rows[i] for i in idx], [bool(worked[i]) for i in idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if (step + 1) % log_every == 0 or step == 0:
            log.append({"step": step + 1, "loss": float(loss.detach()), "s": round(time.perf_counter() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
    model.eval()
    return model, tokenizer, processor, log


def weighted_qtypes(spec: str) -> tuple[str, ...]:
    """"count=6,where=1" -> each named type repeated by its weight, unnamed types once ("" -> every type once)."""
    weights = {q: 1 for q in shapes_vqa.QUESTIONS}
    for part in filter(None, spec.split(",")):
        name, _, w = part.partition("=")
        if name not in weights or not w.isdigit():
            raise ValueError(f"--qtype-weights: cannot read {part!r} (NAME=INTEGER, NAME one of {', '.join(weights)})")
        weights[name] = int(w)
    return tuple(q for q, w in weights.items() for _ in range(w))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo.training.vlm_sft", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-examples", type=int, default=4000)
    p.add_argument("--qtype-weights", default="",
                   help="question-type weights of the demonstrations, e.g. count=6,where=1 (default: all 1)")
    p.add_argument("--worked-fraction", type=float, default=1.0, help="share of worked demonstrations (the rest direct)")
    p.add_argument("--patch-size", type=int, default=8, help="vision tower patch side in pixels (16: one per quadrant)")
    p.add_argument("--vision-hidden", type=int, default=64, help="width of the vision tower")
    p.add_argument("--direct-noise", type=float, default=0.0,
                   help="share of direct demonstrations whose answer is a guess (noisy teacher; worked ones stay right)")
    p.add_argument("--init", default=None, help="continue from this saved VLM directory (default: a fresh model)")
    p.add_argument("--eval-examples", type=int, default=400)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model, tokenizer, processor, log = run_vlm_sft(a.steps, a.batch_size, a.lr, a.seed, a.num_examples,
                                                  worked_fraction=a.worked_fraction, qtypes=weighted_qtypes(a.qtype_weights),
                                                  size={"vision_hidden": a.vision_hidden}, patch_size=a.patch_size,
                                                  direct_noise=a.direct_noise, init=a.init)
    train_s = time.perf_counter() - t0
    held = vision_rows(shapes_vqa.generate("test", a.eval_examples, seed=0), processor, model)
    greedy = evaluate(model, tokenizer, held)
    sampled = evaluate(model, tokenizer, held, temperature=1.0, num_generations=4)
    save_vlm(model, tokenizer, processor, a.out)
    report = {"train_s": round(train_s, 1), "greedy": greedy, "sampled_t1": sampled, "log": log, "args": vars(a)}
    Path(a.out, "sft_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({"train_s": report["train_s"], "greedy": greedy["accuracy"], "sampled": sampled["accuracy"],
                      "per_type_greedy": greedy["per_type"],
                      **{f"{k}_{m}": v for k, d in (("greedy", greedy), ("sampled", sampled))
                         for m, v in d.items() if m.startswith(("worked", "direct"))}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
