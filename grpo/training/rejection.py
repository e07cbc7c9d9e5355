"""Rejection sampling (DeepSeek-R1's second-stage SFT data): K completions per prompt from a policy,
scored by reward functions, filtered, and streamed to a JSONL file of SFT-ready rows.

Each kept row is ``{"prompt", "completion", "prompt_index", "sample", "reward", "rewards": {name: value},
**the prompt's other columns}``; ``prompt``/``completion`` are what ``grpo sft`` trains on. Selection per
prompt (:func:`select`): ``keep=correct`` keeps samples whose first reward is >= ``min_reward``,
``best`` the highest-total sample (if it reaches ``min_reward``), ``all`` every sample; readability filters
(R1) drop samples longer than ``max_length`` tokens, with a language-consistency share below
``min_language`` or a repeated-4-gram fraction above ``max_repetition``; ``dedupe`` keeps one of identical
completions; ``max_per_prompt`` caps the rows of a prompt.

Streaming and resume: rows are written prompt batch by prompt batch (flushed and fsynced), so a stopped
run keeps every finished row. Sampling is keyed by (seed, prompt index, sample) (grpo/rollout/keyed.py),
so :func:`resume_point` drops the rows of the last prompt present (it may be incomplete) and a resumed run
starts again from that prompt, writing no duplicate. A line it cannot read is an error naming the file and
line (never dropped), and the flags that decide the rows are recorded beside the file (:func:`write_settings`):
a resume with one of them changed is refused naming it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo import events
from grpo.rewards import RewardFn, score
from grpo.rewards.text import as_text, chat_completions

KEEP = ("correct", "best", "all")


@dataclass(frozen=True)
class Selection:
    """How samples are kept (the `grpo sample` flags)."""

    keep: str = "correct"
    min_reward: float = 0.5
    max_per_prompt: int = 0          # 0 = no cap
    dedupe: bool = False
    max_length: int = 0              # tokens; 0 = no limit
    min_language: float = 0.0        # language_consistency share; 0 = off
    max_repetition: float = 1.0      # repeated 4-gram fraction; 1 = off


def readable(sample: dict[str, Any], sel: Selection) -> bool:
    """R1's readability filters on one sample (`length`, `language`, `repetition` keys)."""
    return ((not sel.max_length or sample["length"] <= sel.max_length)
            and sample.get("language", 1.0) >= sel.min_language
            and sample.get("repetition", 0.0) <= sel.max_repetition)


def select(samples: list[dict[str, Any]], sel: Selection) -> list[dict[str, Any]]:
    """The kept samples of one prompt, in sample order (each has `completion`, `reward`, `first`, `length`)."""
    if sel.keep not in KEEP:
        raise ValueError(f"--keep must be one of {' | '.join(KEEP)}, got {sel.keep!r}")
    pool = [s for s in samples if readable(s, sel)]
    if sel.keep == "correct":
        pool = [s for s in pool if s["first"] == s["first"] and s["first"] >= sel.min_reward]
    elif sel.keep == "best":
        scored = [s for s in pool if s["reward"] == s["reward"] and s["reward"] >= sel.min_reward]
        pool = [max(scored, key=lambda s: s["reward"])] if scored else []
    if sel.dedupe:
        seen: set[str] = set()
        pool = [s for s in pool if not (s["completion"] in seen or seen.add(s["completion"]))]
    return pool[:sel.max_per_prompt] if sel.max_per_prompt else pool


def settings_path(out: Path) -> Path:
    """Where a run's settings are recorded: a hidden file beside `out` (``.NAME.settings.json``)."""
    return out.with_name(f".{out.name}.settings.json")


def write_settings(out: Path, settings: dict[str, Any]) -> None:
    """Record the flags that decide the rows of `out` (compared by :func:`check_settings` on --resume)."""
    tmp = out.with_name(f".{out.name}.settings.json.tmp")
    tmp.write_text(json.dumps(settings, indent=1) + "\n")
    os.replace(tmp, settings_path(out))


def check_settings(out: Path, settings: dict[str, Any]) -> None:
    """Before a resumed run writes anything: every line of `out` readable (:func:`read_rows`), and the
    recorded settings (if any) equal to `settings`; a ValueError naming the file and line or the flag."""
    read_rows(out)
    recorded = settings_path(out)
    if not recorded.is_file():
        return
    try:
        saved = json.loads(recorded.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{recorded}: unreadable settings of {out} ({e})") from None
    changed = [f"{k} {saved.get(k)!r} -> {v!r}" for k, v in settings.items() if k in saved and saved[k] != v]
    if changed:
        raise ValueError(f"--resume: {out} was sampled with other settings ({'; '.join(changed)}): use the same "
                         f"flags, or choose another --out")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an output file; a torn last line (no newline: a kill came mid-write) is left out. Any
    other line that is not a row with an integer prompt_index is a ValueError naming the file and line."""
    if not path.is_file():
        return []
    lines = path.read_text().split("\n")
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) and line.startswith("{"):
                break                                          # a torn last line (the kill came mid-write)
            raise ValueError(f"{path}:{n}: not a JSON row of grpo sample; fix or remove that line to --resume") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt_index"), int):
            raise ValueError(f"{path}:{n}: a row without an integer prompt_index; fix or remove that line to --resume")
        rows.append(row)
    return rows


def resume_point(path: Path) -> int:
    """Prepare `path` for a resumed run: drop a torn last line and the rows of the last prompt present
    (it may be incomplete; sampling it again writes the same rows); returns the prompt index to start
    from (0 for a new file). An unreadable line is an error (:func:`read_rows`), never dropped."""
    rows = read_rows(path)
    if not path.is_file():
        return 0
    last = max((r["prompt_index"] for r in rows), default=0)
    kept = [r for r in rows if r["prompt_index"] < last]
    tmp = path.with_name(f".{path.name}.resume.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return last


def sample_to_file(model, tokenizer, rows: list[dict[str, Any]], rewards: list[tuple[str, RewardFn]], out: Path, *,
                   num_samples: int, selection: Selection, max_new_tokens: int, temperature: float, seed: int,
                   batch_size: int = 16, start: int = 0, timeout_s: float = 0.0) -> dict[str, int]:
    """Sample `num_samples` completions for rows[start:], keep them by `selection`, append them to `out`.
    Returns counts: prompts done, samples drawn, rows written."""
    from grpo.rewards.language import language_consistency
    from grpo.rewards.shaping import repeated_fraction
    from grpo.training.evaluate import _decode
    from grpo.training.experience import repeat_each, reward_columns

    names = [n for n, _ in rewards]
    counts = {"prompts": 0, "samples": 0, "rows": 0}
    with out.open("a") as fh:
        for first in range(start, len(rows), batch_size):
            chunk = rows[first:first + batch_size]
            batch, gen, texts = _decode(model, tokenizer, chunk, first, max_new_tokens=max_new_tokens,
                                        temperature=temperature, seed=seed, num_samples=num_samples)
            prompts = repeat_each(batch.prompts, num_samples)
            columns = {k: repeat_each(v, num_samples) for k, v in batch.columns.items()}
            scored = score(rewards, None, prompts, chat_completions(prompts, texts), reward_columns(columns, gen),
                           timeout_s=timeout_s)
            table, totals = scored.per_function.tolist(), scored.total.tolist()
            lengths = gen.completion_mask.sum(dim=1).tolist()
            language = (language_consistency(prompts, texts, **({"language": columns["language"]}
                                                                   if "language" in columns else {}))
                        if selection.min_language > 0 else [1.0] * len(texts))
            lines = []
            for r in range(len(chunk)):
                samples = [{"completion": texts[i], "reward": totals[i], "first": table[i][0], "length": int(lengths[i]),
                            "rewards": dict(zip(names, table[i])), "sample": i - r * num_samples,
                            "language": language[i], "repetition": repeated_fraction(as_text(texts[i]), 4)}
                           for i in range(r * num_samples, (r + 1) * num_samples)]
                extra = {k: v[r] for k, v in batch.columns.items() if k not in ("prompt", "completion")}
                for s in select(samples, selection):
                    lines.append(json.dumps({"prompt": batch.prompts[r], "completion": s["completion"],
                                             "prompt_index": first + r, "sample": s["sample"],
                                             "reward": _nan_free(s["reward"]),
                                             "rewards": {k: _nan_free(v) for k, v in s["rewards"].items()}, **extra}))
            fh.write("".join(line + "\n" for line in lines))
            fh.flush()
            os.fsync(fh.fileno())                             # every finished batch survives a kill
            counts["prompts"] += len(chunk)
            counts["samples"] += len(texts)
            counts["rows"] += len(lines)
            events.emit("sample", first + len(chunk))         # prompts done so far
    return counts


def _nan_free(value: Any) -> Any:
    """NaN (a reward that did not apply) as JSON null."""
    return None if isinstance(value, float) and value != value else value

