"""Checks of what a run means, once the model, its tokenizer and the prompts are known.

The config's own rules (grpo/config/checks.py) see only numbers; these see the objects they apply
to. :func:`check_run` is called by the trainer's setup, before anything is written:

* the token ids of the tokenizer must fit the model's input embedding (a ValueError naming both
  sizes, instead of an IndexError in the middle of the first rollout);
* the longest prompt plus ``rollout.max_new_tokens`` must fit the model's positions: an error for
  absolute (learned) position embeddings such as GPT-2's ``wpe``, whose table simply ends; a warning
  for rotary and other relative schemes, which run past their trained length but degrade;
* ``rollout.temperature`` 0 samples greedily: the G completions of a prompt are identical, so their
  rewards tie and every group-relative advantage is 0 (a warning: no learning signal).

A reward function returning None for a whole batch is warned about where it happens
(grpo/rewards/scoring.py ``warn_no_signal``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from grpo.config import Config, ConfigError

log = logging.getLogger(__name__)

#: Names of the submodules that hold absolute (learned) position embeddings, by architecture family.
ABSOLUTE_POSITION_MODULES = ("wpe", "embed_positions", "position_embeddings")
#: Config attributes that state a model's position limit, in the order they are looked up.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class PositionLimit:
    """How many positions a model has, whether its table of positions is absolute, and the source."""

    positions: int
    absolute: bool
    source: str          # e.g. "n_positions=64" or "transformer.wpe (64 rows)"


def inner_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def position_limit(model: torch.nn.Module) -> PositionLimit | None:
    """The model's position limit: its absolute position-embedding table if it has one, else the
    limit its config states (rotary / relative positions); None when neither exists (e.g. ALiBi
    models without a stated limit)."""
    inner = inner_model(model)
    for name, module in inner.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in ABSOLUTE_POSITION_MODULES:
            rows = module.num_embeddings - int(getattr(module, "offset", 0))   # OPT keeps 2 extra rows
            return PositionLimit(rows, True, f"{name} ({rows} rows)")
    config = getattr(inner, "config", None)
    for key in POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return PositionLimit(value, False, f"{key}={value}")
    return None


def longest_prompt(rows: list[dict[str, Any]]) -> int:
    """Tokens of the longest tokenized prompt (0 when the rows carry no token ids)."""
    from grpo.data.prompts import IDS_KEY

    return max((len(r[IDS_KEY]) for r in rows if IDS_KEY in r), default=0)


def check_positions(model: torch.nn.Module, max_new_tokens: int, prompt_tokens: int) -> None:
    """ConfigError when the longest sequence passes an absolute position table; warning past a
    rotary / relative model's stated limit."""
    limit = position_limit(model)
    needed = prompt_tokens + max_new_tokens
    if limit is None or needed <= limit.positions:
        return
    what = (f"rollout.max_new_tokens={max_new_tokens} plus the longest prompt ({prompt_tokens} tokens) needs "
            f"{needed} positions")
    if limit.absolute:
        raise ConfigError(f"{what}, but the model has {limit.positions} absolute position embeddings "
                          f"({limit.source}): lower rollout.max_new_tokens (or data.max_prompt_length)")
    log.warning("warning: %s, past the model's %s: it was not trained on such lengths and may degrade "
                "(lower rollout.max_new_tokens or data.max_prompt_length)", what, limit.source)


def check_vocabulary(model: torch.nn.Module, tokenizer: Any) -> None:
    """ValueError when the tokenizer has more tokens than the model's input embedding has rows."""
    try:
        embedding = inner_model(model).get_input_embeddings()
    except (AttributeError, NotImplementedError):          # a model without the accessor: nothing to compare
        return
    rows = getattr(embedding, "num_embeddings", None)
    tokens = len(tokenizer)
    if rows is not None and tokens > rows:
        raise ValueError(f"the tokenizer has {tokens} tokens but the model's input embedding has {rows} rows: ids "
                         f"{rows}..{tokens - 1} would index past it (use the model's own tokenizer, or call "
                         f"model.resize_token_embeddings(len(tokenizer)))")


def check_sampling(cfg: Config) -> None:
    """Warn when the sampling settings leave no learning signal (temperature 0: identical samples)."""
    if cfg.rollout.temperature == 0:
        log.warning("warning: rollout.temperature=0 samples greedily: the %d completions of a prompt are identical, "
                    "their rewards tie and every advantage is 0 (no learning signal); use a temperature > 0",
                    cfg.rollout.num_generations)


def check_run(cfg: Config, model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, Any]]) -> None:
    """Every check of this module, for a run about to start (errors before anything is written)."""
    check_vocabulary(model, tokenizer)
    check_positions(model, cfg.rollout.max_new_tokens, longest_prompt(rows))
    check_sampling(cfg)
    check_images(model, rows)


def check_images(model: torch.nn.Module, rows: list[dict[str, Any]]) -> None:
    """A vision-language model (grpo.modeling.vlm.is_vlm) needs every prompt's image as ``pixel_values``
    (grpo.modeling.vlm.vision_rows makes them): without it the placeholders would silently be read as text."""
    from grpo.modeling.vlm import is_vlm

    if not is_vlm(model):
        return
    missing = next((i for i, r in enumerate(rows) if r.get("pixel_values") is None), None)
    if missing is not None:
        raise ValueError(f"prompt row {missing} has no 'pixel_values' but the model is a vision-language model: "
                         f"pass each row's image through grpo.modeling.vlm.vision_rows (docs/vlm.md)")
