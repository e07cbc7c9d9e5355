"""Training a reward model: a single-logit sequence classifier on completions labelled by a rule or judge
function (DeepSeekMath's iterative RL retrains its reward model on the current policy's samples, with a
replay of 10% of the historical data).

Items are ``(text, add_special_tokens, label)`` with the text a reward model scores
(grpo.rewards.reward_model.reward_text) and label 1 (good) or 0 (bad). Losses:

    pointwise   BCE(sigmoid(r(x)), y)                                    per item
    pairwise    -log sigmoid(r(x_good) - r(x_bad))  (Bradley-Terry)      per pair of one prompt

Replay (:func:`mixed_batch`): each batch of B items holds round(replay x B) items drawn from the history
(:class:`ReplayBuffer`, everything trained on before) and the rest from the new samples.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from grpo.rewards.reward_model import encode_texts, max_length

Item = tuple[str, bool, int]        # (text, add_special_tokens, label)
LOSSES = ("pointwise", "pairwise")


@dataclass
class ReplayBuffer:
    """Every item trained on so far (the history replayed into later batches)."""

    items: list[Item] = field(default_factory=list)

    def add(self, items: list[Item]) -> None:
        self.items.extend(items)


def mixed_batch(new: list[Item], start: int, history: ReplayBuffer | None, batch_size: int, replay: float,
                rng: random.Random) -> list[Item]:
    """A batch of `batch_size`: round(replay x batch_size) items drawn from `history` (when it has any),
    the rest the new items from position `start` on (cycling)."""
    n_replay = round(replay * batch_size) if history is not None and history.items else 0
    fresh = [new[(start + i) % len(new)] for i in range(batch_size - n_replay)]
    return fresh + [rng.choice(history.items) for _ in range(n_replay)]


def scores(model, tokenizer, items: list[Item], batch_size: int = 32) -> torch.Tensor:
    """The reward model's logit of every item (autograd when enabled), tokenized as the reward function
    reads them (grpo.rewards.reward_model.encode_texts).  Shape: [n]."""
    limit = max_length(model, tokenizer)
    index: list[int] = []
    values: list[torch.Tensor] = []
    for special in (True, False):
        rows = [i for i, it in enumerate(items) if it[1] is special]
        for s in range(0, len(rows), batch_size):
            chunk = rows[s:s + batch_size]
            enc = encode_texts(model, tokenizer, [items[i][0] for i in chunk], special, limit)
            values.append(model(**enc).logits[:, 0].float())                # [b]
            index += chunk
    flat = torch.cat(values)                                                  # [n] in `index` order
    where = torch.tensor(index, device=flat.device)
    return torch.empty_like(flat).scatter(0, where, flat)                     # [n] in item order


def batch_loss(model, tokenizer, batch: list[Item], loss: str) -> torch.Tensor:
    """The mean loss of one batch (pairwise: every good x bad pair within the batch)."""
    r = scores(model, tokenizer, batch)                                       # [B]
    y = torch.tensor([it[2] for it in batch], dtype=torch.float32, device=r.device)
    if loss == "pointwise":
        return F.binary_cross_entropy_with_logits(r, y)
    good, bad = r[y == 1], r[y == 0]
    if not good.numel() or not bad.numel():
        return F.binary_cross_entropy_with_logits(r, y)                       # no pair: fall back to pointwise
    return -F.logsigmoid(good[:, None] - bad[None, :]).mean()


def train_reward_model(model, tokenizer, items: list[Item], *, steps: int, batch_size: int = 16, lr: float = 1e-3,
                       loss: str = "pointwise", history: ReplayBuffer | None = None, replay: float = 0.0,
                       seed: int = 0) -> list[float]:
    """`steps` AdamW steps on `items` (mixed with `replay` of `history`); adds `items` to `history`.
    Returns the loss of every step."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {' | '.join(LOSSES)}, got {loss!r}")
    if not items:
        raise ValueError("no labelled samples to train the reward model on")
    rng = random.Random(seed)
    order = items[:]
    rng.shuffle(order)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses = []
    for step in range(steps):
        batch = mixed_batch(order, step * batch_size, history, batch_size, replay, rng)
        value = batch_loss(model, tokenizer, batch, loss)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        losses.append(float(value.detach()))
    model.eval()
    if history is not None:
        history.add(items)
    return losses


@torch.no_grad()
def accuracy(model, tokenizer, items: list[Item]) -> float:
    """Share of items whose logit has the sign of their label (> 0 for 1)."""
    r = scores(model, tokenizer, items)
    y = torch.tensor([it[2] for it in items], device=r.device)
    return float(((r > 0).long() == y).float().mean()) if items else float("nan")


def new_reward_model(base_dir: str, tokenizer) -> Any:
    """A single-logit sequence classifier on the backbone of the causal LM in `base_dir` (a fresh head)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1)
    model.config.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else tokenizer.pad_token_id
    return model
