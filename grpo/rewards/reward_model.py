"""Reward models: a local ``AutoModelForSequenceClassification`` directory with one label.

The score of a completion is the logit of the single label on prompt + completion:

* a plain-text prompt: the concatenation ``prompt + completion``, tokenized with the reward
  model's tokenizer (its usual special tokens added);
* a conversational prompt (a list of ``{"role", "content"}`` messages): the reward model's
  chat template applied to ``prompt + [{"role": "assistant", "content": completion}]``, tokenized
  without adding special tokens again (the template carries them).

Inputs longer than the reward model's maximum length are truncated on the LEFT: the end of the
completion, where a causal classifier reads its score (the last non-pad token), is always kept and
the start of the prompt is dropped.  Batches are right-padded; with a causal model the real tokens
never see the padding, and the classifier head picks each row's last non-pad token, so a batched
score equals the one-at-a-time score.  Scoring runs in eval mode under ``torch.no_grad()``, in the reward
model's own dtype (float32 for a directory; a loaded model keeps its own): the policy's ``train.precision``
autocast is paused around it.  The trainer and ``grpo eval`` / ``grpo sample`` move reward models to the
policy's device (:func:`place_reward_models`), as TRL places them with its accelerator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from grpo.modeling.models import load_tokenizer, resolve_dtype
from grpo.rewards.calling import RewardError
from grpo.rewards.text import as_text

#: Texts scored per forward pass.
RM_BATCH_SIZE = 8
#: Used when neither the tokenizer nor the config gives a usable maximum length.
FALLBACK_MAX_LENGTH = 2048


def is_reward_model_dir(path: str | Path) -> bool:
    """True for a directory whose ``config.json`` names a ``...ForSequenceClassification`` architecture."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return False
    architectures = json.loads(config_file.read_text()).get("architectures") or []
    return any(name.endswith("ForSequenceClassification") for name in architectures)


def max_length(model, tokenizer) -> int:
    """The longest input the reward model accepts: tokenizer limit, else config positions."""
    limit = tokenizer.model_max_length
    if isinstance(limit, int) and 0 < limit < 1_000_000:
        return limit
    positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    return positions or FALLBACK_MAX_LENGTH


def reward_text(tokenizer, prompt, completion) -> tuple[str, bool]:
    """The text the reward model scores and whether the tokenizer should add special tokens.

    ``prompt`` is a string or a list of chat messages; ``completion`` is a string (or, for chat
    prompts, a list of assistant messages).
    """
    if isinstance(prompt, str):
        return prompt + as_text(completion), True
    if not getattr(tokenizer, "chat_template", None):
        raise RewardError("reward model tokenizer has no chat template, but the prompt is a conversation")
    reply = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
    return tokenizer.apply_chat_template(list(prompt) + reply, tokenize=False), False


def encode_texts(model, tokenizer, texts: list[str], add_special_tokens: bool, limit: int) -> dict[str, torch.Tensor]:
    """What a reward model reads: right-padded, left-truncated to `limit` tokens (the end of the completion is
    kept), on the model's device. [n] -> input_ids, attention_mask [n, L]"""
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    enc = tokenizer(texts, add_special_tokens=add_special_tokens, padding=True, truncation=True,
                    max_length=limit, return_tensors="pt")
    device = next(model.parameters()).device
    return {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device)}


class RewardModel:
    """Callable reward ``fn(prompts=, completions=, **columns) -> list[float]`` backed by a classifier
    (called by keyword like every reward; the columns are ignored)."""

    def __init__(self, model, tokenizer, batch_size: int = RM_BATCH_SIZE):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length(model, tokenizer)

    def encode(self, texts: list[str], add_special_tokens: bool) -> dict[str, torch.Tensor]:
        """Right-padded, left-truncated batch on the model's device. [n] -> [n, L]"""
        return encode_texts(self.model, self.tokenizer, texts, add_special_tokens, self.max_length)

    @torch.no_grad()
    def score_texts(self, texts: list[str], add_special_tokens: bool = True) -> list[float]:
        """One float per text: the single logit, ``batch_size`` texts per forward pass."""
        scores: list[float] = []
        device = next(self.model.parameters()).device
        with torch.autocast(device_type=device.type, enabled=False):  # its own dtype, not train.precision's
            for start in range(0, len(texts), self.batch_size):
                logits = self.model(**self.encode(texts[start:start + self.batch_size], add_special_tokens)).logits
                scores.extend(logits[:, 0].float().tolist())                              # [n]
        return scores

    def __call__(self, prompts: list, completions: list, **columns) -> list[float]:
        """Score every (prompt, completion) pair, grouping texts by their special-token handling."""
        pairs = [reward_text(self.tokenizer, p, c) for p, c in zip(prompts, completions)]
        scores: list[float] = [0.0] * len(pairs)
        for add_special in (True, False):
            index = [i for i, (_, flag) in enumerate(pairs) if flag is add_special]
            for i, value in zip(index, self.score_texts([pairs[i][0] for i in index], add_special)):
                scores[i] = value
        return scores


def load_reward_model(path: str | Path, batch_size: int = RM_BATCH_SIZE, dtype: str = "float32",
                      trust_remote_code: bool = False) -> tuple[str, Callable]:
    """``("rm:<dirname>", RewardModel)`` for a local single-label sequence-classifier directory.

    Errors are one-line ``RewardError``s: not a directory, no config.json, not a sequence
    classifier, ``num_labels != 1``, no pad token.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    directory = Path(path).expanduser().resolve()
    if not (directory / "config.json").is_file():
        raise RewardError(f"reward model directory has no config.json: {directory}")
    if not is_reward_model_dir(directory):
        raise RewardError(f"{directory} is not a sequence-classification reward model "
                     "(config.json architectures must end in ForSequenceClassification)")
    config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    if config.num_labels != 1:
        raise RewardError(f"reward model {directory} has num_labels={config.num_labels}; a reward model needs exactly 1")
    try:
        tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise RewardError(f"reward model {directory}: {e}") from None
    model = AutoModelForSequenceClassification.from_pretrained(
        str(directory), dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code)
    if model.config.pad_token_id is None:  # the head finds each row's last token through the pad id
        model.config.pad_token_id = tokenizer.pad_token_id
    return f"rm:{directory.name}", RewardModel(model, tokenizer, batch_size)


def place_reward_models(rewards: list[tuple[str, Callable]], device: torch.device) -> int:
    """Move the classifier of every :class:`RewardModel` in (name, fn) pairs `rewards` to `device`, in place.
    Returns how many moved."""
    moved = 0
    for _, fn in rewards:
        param = next(fn.model.parameters(), None) if isinstance(fn, RewardModel) else None
        if param is not None and param.device != device:
            fn.model.to(device)
            moved += 1
    return moved


def is_reward_model(obj) -> bool:
    """A loaded ``...ForSequenceClassification`` model (what TRL's reward_funcs accept as a reward model)."""
    return isinstance(obj, torch.nn.Module) and type(obj).__name__.endswith("ForSequenceClassification")


def wrap_reward_model(model, tokenizer=None, batch_size: int = RM_BATCH_SIZE) -> tuple[str, Callable]:
    """``("rm:<name>", RewardModel)`` for a loaded sequence classifier, as TRL takes one in reward_funcs; its
    tokenizer is `tokenizer` (TRL's reward_processing_classes) or the one saved in the model's directory."""
    if model.config.num_labels != 1:
        raise RewardError(f"reward model {type(model).__name__} has num_labels={model.config.num_labels}; a reward "
                     "model needs exactly 1")
    source = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
    if tokenizer is None:
        if not source or not Path(source).is_dir():
            raise RewardError(f"reward model {type(model).__name__}: no tokenizer given and none saved beside it "
                         f"({source or 'no directory'}); pass reward_processing_classes=")
        try:
            tokenizer = load_tokenizer(Path(source))
        except (OSError, ValueError) as e:
            raise RewardError(f"reward model {source}: {e}") from None
    if model.config.pad_token_id is None:  # the head finds each row's last token through the pad id
        model.config.pad_token_id = tokenizer.pad_token_id
    return f"rm:{Path(source).name if source else type(model).__name__}", RewardModel(model, tokenizer, batch_size)

