"""Prompts: a dataset or the embedded task, rendered and tokenized once, a seeded epoch order, batches.

Rendering (done at load time when a tokenizer is given):

* conversational prompts (lists of ``{"role", "content"}``) go through the tokenizer's chat template
  with ``add_generation_prompt=True``; ``data.system_prompt`` is prepended as a system message
  unless the first message already is one;
* string prompts are used verbatim; with ``data.system_prompt`` set they become a user message
  after the system message (rendered with the chat template) when the tokenizer has one, and
  otherwise the text is ``system_prompt + "\\n" + prompt``.

Chat-templated text is tokenized without adding special tokens (the template has them); plain
text with them (as ``tokenizer(text)`` does). Reward functions always receive the raw prompt
(string or message list), as in TRL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from grpo.config import ConfigError, DataConfig
from grpo.data.datasets_io import DataError, read_dataset, read_jsonl  # noqa: F401  (re-exported)
from grpo.data.tasks import TASKS
from grpo.types import PromptBatch

log = logging.getLogger(__name__)

#: Private row key holding the prompt's token ids (rendered, length policy applied).
IDS_KEY = "_grpo_prompt_ids"
#: Row columns that are extra forward inputs of the prompt, not reward columns: stacked into
#: PromptBatch.model_inputs (a VLM's image through its processor, docs/vlm.md).
MODEL_INPUT_COLUMNS = ("pixel_values",)


@dataclass
class PromptSet:
    """The training prompts and what loading did to them (for the trainer's log)."""

    rows: list[dict[str, Any]]   # each has "prompt" (raw) and, with a tokenizer, IDS_KEY
    source: str                  # dataset path, or "task 'arithmetic'"
    conversational: bool         # prompts are message lists
    num_dropped: int = 0         # prompts longer than data.max_prompt_length that were dropped
    num_truncated: int = 0       # ... or left-truncated
    num_skipped: int = 0         # malformed rows left out (data.skip_bad_rows)


def has_chat_template(tokenizer) -> bool:
    """True when the tokenizer can render messages."""
    return bool(getattr(tokenizer, "chat_template", None))


def with_system_prompt(messages: list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """The messages with a leading system message (unless there is none to add or one already)."""
    if not system_prompt or (messages and messages[0].get("role") == "system"):
        return list(messages)
    return [{"role": "system", "content": system_prompt}, *messages]


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """Drop None-valued keys (Arrow fills absent struct fields with None; templates test `'key' in m`)."""
    return {k: v for k, v in message.items() if v is not None or k in ("role", "content")}


def uses_chat_template(tokenizer, conversational: bool, system_prompt: str | None) -> bool:
    """Whether prompts are rendered with the chat template (see the module docstring)."""
    return conversational or bool(system_prompt and has_chat_template(tokenizer))


def render_prompt(tokenizer, prompt: str | list[dict[str, Any]], system_prompt: str | None = None,
                  tools: list | None = None, template_kwargs: dict[str, Any] | None = None) -> str:
    """The text the policy sees for one raw prompt (see the module docstring); `tools` (functions of a
    multi-turn environment) go to the chat template, which renders their JSON schemas; `template_kwargs`
    (``data.chat_template_kwargs``, e.g. enable_thinking) go to it too."""
    if isinstance(prompt, str):
        if not system_prompt:
            return prompt
        if not has_chat_template(tokenizer):
            return f"{system_prompt}\n{prompt}"
        prompt = [{"role": "user", "content": prompt}]
    if not has_chat_template(tokenizer):
        raise DataError("chat-message prompts need a tokenizer with a chat template (tokenizer.chat_template)")
    messages = [_clean(m) for m in with_system_prompt(prompt, system_prompt)]
    extra = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)


def encode_prompts(tokenizer, prompts: list, system_prompt: str | None, conversational: bool,
                   tools: list | None = None, template_kwargs: dict[str, Any] | None = None) -> list[list[int]]:
    """Token ids of every rendered prompt, one tokenizer call for the whole list."""
    texts = [render_prompt(tokenizer, p, system_prompt, tools, template_kwargs) for p in prompts]
    templated = uses_chat_template(tokenizer, conversational, system_prompt)
    return tokenizer(texts, add_special_tokens=not templated)["input_ids"]


def apply_length_policy(ids: list[list[int]], max_len: int, policy: str, source: str,
                        where: list[str]) -> tuple[list[int], list[list[int]], int, int]:
    """(kept row indices, their ids, num dropped, num truncated) under data.long_prompts.

    drop: leave long prompts out; truncate: keep their last `max_len` tokens; error: raise.
    """
    long = [i for i, x in enumerate(ids) if max_len and len(x) > max_len]
    if not long:
        return list(range(len(ids))), ids, 0, 0
    limit = f"data.max_prompt_length={max_len} tokens"
    if policy == "error":
        first = long[0]
        raise DataError(f"{source}: {len(long)} of {len(ids)} prompts are longer than {limit} (first: "
                        f"{where[first]}, {len(ids[first])} tokens); data.long_prompts=error")
    if policy == "truncate":
        log.warning("%s: left-truncated %d of %d prompts to their last %s", source, len(long), len(ids), limit)
        return list(range(len(ids))), [x[-max_len:] for x in ids], 0, len(long)
    if len(long) == len(ids):
        raise DataError(f"{source}: all {len(ids)} prompts are longer than {limit} (longest: "
                        f"{max(map(len, ids))}); raise it or set data.long_prompts=truncate")
    log.warning("%s: dropped %d of %d prompts longer than %s", source, len(long), len(ids), limit)
    skip = set(long)
    kept = [i for i in range(len(ids)) if i not in skip]
    return kept, [ids[i] for i in kept], len(long), 0


def _embedded_rows(cfg: DataConfig, seed: int) -> list[dict[str, Any]]:
    """The embedded task's train split."""
    if cfg.task not in TASKS:
        raise ConfigError(f"data.task must be one of {sorted(TASKS)}, got '{cfg.task}'")
    return TASKS[cfg.task].generate("train", cfg.num_train_prompts, seed=seed)


def load_prompts(cfg: DataConfig, seed: int = 0, tokenizer=None, records=None, tools: list | None = None) -> PromptSet:
    """The training prompts: in-memory `records` (grpo.data.datasets_io.Records, e.g. from the Python API),
    a dataset file/directory, or the embedded task's train split. The same column rules apply to all.

    With a tokenizer every prompt is rendered and tokenized once (ids under ``IDS_KEY``) and the
    ``data.max_prompt_length`` policy is applied. Without one the rows stay raw, which is only
    allowed for string prompts with neither a system prompt nor a length limit.
    """
    skipped: list[str] = []
    if records is not None or cfg.dataset:
        rec, conversational = read_dataset(cfg, records)
        rows, where, source, skipped = rec.rows, rec.where, rec.source, rec.skipped
        if skipped:
            log.warning("warning: data.skip_bad_rows: skipped %d of %d rows of %s (first: %s)", len(skipped),
                        len(skipped) + len(rows), source, skipped[0])
    else:
        rows, source, conversational = _embedded_rows(cfg, seed), f"task '{cfg.task}'", False
        where = [f"{source} row {i}" for i in range(len(rows))]
    if tokenizer is None:
        if conversational or cfg.system_prompt or cfg.max_prompt_length:
            raise DataError(f"{source}: chat prompts, data.system_prompt and data.max_prompt_length need the "
                            f"tokenizer (pass tokenizer= to load_prompts)")
        return PromptSet(rows, source, conversational, num_skipped=len(skipped))
    if conversational and not has_chat_template(tokenizer):
        raise DataError(f"{source}: prompts are chat messages but the tokenizer has no chat template; "
                        f"set tokenizer.chat_template or use string prompts")
    ids = encode_prompts(tokenizer, [r["prompt"] for r in rows], cfg.system_prompt, conversational, tools,
                         dict(cfg.chat_template_kwargs))
    kept, ids, dropped, truncated = apply_length_policy(ids, cfg.max_prompt_length, cfg.long_prompts, source, where)
    rows = [dict(rows[i], **{IDS_KEY: x}) for i, x in zip(kept, ids)]
    return PromptSet(rows, source, conversational, dropped, truncated, len(skipped))


def load_prompt_rows(cfg: DataConfig, seed: int = 0, tokenizer=None) -> list[dict[str, Any]]:
    """The rows of :func:`load_prompts` (kept for callers that need no statistics)."""
    return load_prompts(cfg, seed, tokenizer).rows


class PromptStream:
    """An endless, seeded sequence of prompt rows: a fresh permutation every epoch.

    Its position (generator state, the rest of the current epoch's order, the epoch) is
    :meth:`state_dict`; a checkpoint stores it so a resumed run draws the same prompts.
    """

    def __init__(self, rows: list[dict[str, Any]], seed: int, shuffle: bool = True):
        self.rows, self.shuffle = rows, shuffle
        self.generator = torch.Generator(device="cpu").manual_seed(seed)   # host-side: data order
        self.order: list[int] = []
        self.epoch = 0

    def next(self, n: int) -> list[dict[str, Any]]:
        out = []
        while len(out) < n:
            if not self.order:
                self.epoch += 1
                rows = len(self.rows)
                perm = (torch.randperm(rows, generator=self.generator, device="cpu") if self.shuffle
                        else torch.arange(rows, device="cpu"))
                self.order = perm.tolist()[::-1]       # reversed: the next row is popped from the end
            out.append(self.rows[self.order.pop()])
        return out

    @property
    def position(self) -> int:
        """Rows drawn so far over all epochs: the global index of the next row drawn (derived from the
        epoch and the rest of its order, so a checkpointed stream knows it without extra state)."""
        return self.epoch * len(self.rows) - len(self.order)

    def next_indexed(self, n: int) -> tuple[list[dict[str, Any]], list[int]]:
        """:meth:`next` with the global index (draw position) of each row, which keys its sampling."""
        start = self.position
        return self.next(n), list(range(start, start + n))

    def state_dict(self) -> dict[str, Any]:
        """The position in the data order (tensors and ints: loads with torch.load(weights_only=True))."""
        order = torch.tensor(self.order[::-1], dtype=torch.long, device="cpu")
        return {"generator": self.generator.get_state(), "order": order, "epoch": self.epoch, "num_rows": len(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; DataError when the dataset has changed size since."""
        if int(state["num_rows"]) != len(self.rows):
            raise DataError(f"the prompt set has {len(self.rows)} rows but the checkpoint was written with "
                            f"{int(state['num_rows'])}: the dataset (or its filters) changed")
        self.generator.set_state(state["generator"])
        self.order = state["order"].tolist()[::-1]
        self.epoch = int(state["epoch"])


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and attention mask, right-aligned, built on the host (the caller moves them once).
    Shapes: [B, P] long each, P = longest sequence."""
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(seqs), P), dtype=torch.long, device="cpu")
    for i, s in enumerate(seqs):
        if s:
            ids[i, P - len(s):] = torch.tensor(s, dtype=torch.long, device="cpu")
            mask[i, P - len(s):] = 1
    return ids, mask


def tokenize_prompts(tokenizer, rows: list[dict[str, Any]], device: torch.device | str = "cpu") -> PromptBatch:
    """Left-padded prompt ids and the other columns (B values each).

    Rows from :func:`load_prompts` with a tokenizer carry their ids; other rows (e.g. an embedded
    task's split) must have string prompts, tokenized here as ``tokenizer(prompt)``.
    """
    prompts = [r["prompt"] for r in rows]
    if all(IDS_KEY in r for r in rows):
        seqs = [r[IDS_KEY] for r in rows]
    elif all(isinstance(p, str) for p in prompts):
        seqs = tokenizer(prompts)["input_ids"]
    else:
        raise DataError("chat-message prompts must be rendered first: "
                        "load them with load_prompts(cfg, seed, tokenizer)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise DataError("the tokenizer has neither a pad token nor an eos token to pad prompts with")
    ids, mask = left_pad(seqs, pad_id)
    columns = {k: [r.get(k) for r in rows]
               for k in sorted({k for r in rows for k in r} - {"prompt", IDS_KEY, *MODEL_INPUT_COLUMNS})}
    return PromptBatch(prompts=prompts, prompt_ids=ids.to(device), prompt_mask=mask.to(device),   # [B, P]
                       columns=columns, model_inputs=model_inputs_of(rows, device))


def model_inputs_of(rows: list[dict[str, Any]], device: torch.device | str) -> dict[str, torch.Tensor]:
    """The rows' MODEL_INPUT_COLUMNS stacked on `device`: name -> [B, ...]. A column that some rows have and
    others lack is a DataError naming the first row without it."""
    out = {}
    for name in MODEL_INPUT_COLUMNS:
        have = [r.get(name) is not None for r in rows]
        if not any(have):
            continue
        if not all(have):
            raise DataError(f"prompt row {have.index(False)} has no {name!r} while other rows of its batch have one "
                            f"(every row of a vision-language run needs its image)")
        out[name] = torch.stack([torch.as_tensor(r[name], device=device) for r in rows])       # [B, ...]
    return out
