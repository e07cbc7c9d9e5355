"""Held-out evaluation: one entry point, :func:`evaluate`, for `grpo eval`, ``Trainer.evaluate``, the
evaluation during training (``train.eval_steps``), the episode (tool) evaluation, the VLM's and the cold
start's. Completions are decoded exactly as in training (the rollout sampler and
grpo.training.experience.decode_completions) and scored by reward functions. What differs is an input:

    rows in chunks -> play (decode: the native engine; grpo.training.episode_eval.Episodes: tool episodes)
    -> the reward functions -> a summary (RewardMeans: the mean of each; PassAtK: pass@k, maj@k and one
    record per row; TextMetrics: a function of the texts, e.g. the VLM's accuracy; EpisodeMeans)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grpo.algorithms.sampling_metrics import maj_at_k, pass_at_k
from grpo.data.prompts import tokenize_prompts
from grpo.rewards import RewardFn, score
from grpo.rewards.text import chat_completions
from grpo.rollout import eos_token_ids
from grpo.rollout.engines.native import NativeEngine
from grpo.rollout.params import SamplingParams


def _decode(model, tokenizer, chunk: list[dict[str, Any]], start: int, *, max_new_tokens: int, temperature: float,
            seed: int, num_samples: int = 1):
    """Rows `chunk` (starting at row `start` of the evaluation) -> (PromptBatch, Generation, texts); a VLM's
    rows carry their pixel values to the model (PromptBatch.model_inputs)."""
    from grpo.training.experience import decode_completions  # the same decoding as in training

    device = next(model.parameters()).device
    batch = tokenize_prompts(tokenizer, chunk, device)
    params = SamplingParams(n=num_samples, temperature=temperature, max_tokens=max_new_tokens,
                            stop_token_ids=eos_token_ids(tokenizer, model), seed=seed)
    gen = NativeEngine(model, tokenizer.pad_token_id).generate(
        batch.prompt_ids, batch.prompt_mask, params,
        prompt_index=torch.arange(start, start + len(chunk), device=device),                 # [b] row keys
        model_inputs=batch.model_inputs)
    return batch, gen, decode_completions(tokenizer, gen)


@dataclass
class Played:
    """One chunk of rows played: what the reward functions and the summaries read."""

    start: int                        # the chunk's first row in the evaluation
    rows: list[dict[str, Any]]
    prompts: list                     # per completion (row-major: row 0's samples first)
    completions: list                 # what the reward functions get (chat_completions, or episode messages)
    columns: dict[str, list]          # their keyword columns, per completion
    gen: Any                          # the Generation (completion_mask: the lengths)
    texts: list[str] = field(default_factory=list)
    weights: list[float] | None = None                 # reward.weights for the reward call
    totals: dict[str, float] = field(default_factory=dict)   # the play's own sums (episodes: tool use)


def decode(model, tokenizer, rows: list[dict[str, Any]], start: int, *, max_new_tokens: int, temperature: float,
           seed: int, num_samples: int) -> Played:
    """The text play: `num_samples` completions of each row through the native engine."""
    from grpo.training.experience import repeat_each, reward_columns

    batch, gen, texts = _decode(model, tokenizer, rows, start, max_new_tokens=max_new_tokens,
                                temperature=temperature, seed=seed, num_samples=num_samples)
    prompts = repeat_each(batch.prompts, num_samples)
    columns = {k: repeat_each(v, num_samples) for k, v in batch.columns.items()}
    return Played(start, rows, prompts, chat_completions(prompts, texts), reward_columns(columns, gen), gen, texts)


@torch.no_grad()
def generate_texts(model, tokenizer, rows: list[dict[str, Any]], *, max_new_tokens: int = 48, batch_size: int = 64,
                   temperature: float = 0.0, seed: int = 0, num_samples: int = 1) -> list[str]:
    """`num_samples` completions of every row's ``prompt`` as text (row-major: row 0's samples first),
    greedy at temperature 0, else sampled with keys (seed, row index, sample), independent of `batch_size`."""
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        texts += _decode(model, tokenizer, rows[start:start + batch_size], start, max_new_tokens=max_new_tokens,
                         temperature=temperature, seed=seed, num_samples=num_samples)[2]
    return texts


class RewardMeans:
    """The mean of each reward function over the rows (NaN scores left out; a function without any scores
    0.0) and ``completion_length``, the mean tokens per row: {"accuracy": 0.41, "format": 0.99, ...}."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.lengths, self.rows = 0.0, 0

    def add(self, played: Played, scored) -> None:
        for k, name in enumerate(scored.names if scored is not None else []):
            col = scored.per_function[:, k]
            ok = ~torch.isnan(col)
            self.sums[name] = self.sums.get(name, 0.0) + float(col[ok].sum())
            self.counts[name] = self.counts.get(name, 0) + int(ok.sum())
        self.lengths += float(played.gen.completion_mask.sum())
        self.rows += len(played.rows)

    def result(self, names: list[str]) -> dict[str, float]:
        out = {name: self.sums.get(name, 0.0) / max(self.counts.get(name, 0), 1) for name in names}
        out["completion_length"] = self.lengths / max(self.rows, 1)
        return out


class TextMetrics:
    """``metrics(texts, rows)`` over every completion's text and its row (row-major, one row per sample)."""

    def __init__(self, metrics: Callable[[list[str], list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.metrics, self.texts, self.rows = metrics, [], []

    def add(self, played: Played, scored) -> None:
        k = len(played.texts) // max(len(played.rows), 1)
        self.texts += played.texts
        self.rows += [r for r in played.rows for _ in range(k)]

    def result(self, names: list[str]) -> dict[str, Any]:
        return self.metrics(self.texts, self.rows)


class PassAtK:
    """`num_samples` completions per row: (summary, one record per row). A sample is correct when the first
    reward function gives it >= `threshold`. The summary holds pass@1 (mean correctness over all samples),
    unbiased pass@k for each k of `ks` (grpo.algorithms.sampling_metrics), maj@k with `maj` (answers from
    `extract`, default the last <answer> block or \\boxed{}, grouped by math-verify equivalence), every
    reward's mean (reward/<name>) and the mean completion length in tokens."""

    def __init__(self, num_samples: int, ks: list[int], maj: bool = False, threshold: float = 0.5,
                 extract: Callable[[str], str | None] | None = None) -> None:
        from grpo.rewards.math_answer import final_answer

        if any(not 1 <= k <= num_samples for k in ks):
            raise ValueError(f"every k must be in 1..{num_samples} (the samples per problem), got {ks}")
        self.num_samples, self.ks, self.maj, self.threshold = num_samples, ks, maj, threshold
        self.extract = extract or final_answer
        self.records: list[dict[str, Any]] = []

    def add(self, played: Played, scored) -> None:
        from grpo.rewards.math_answer import answers_match

        K, texts, names = self.num_samples, played.texts, scored.names
        table = scored.per_function.tolist()                                  # [n * K, R]
        lengths = played.gen.completion_mask.sum(dim=1).tolist()              # [n * K]
        for r in range(len(played.rows)):
            span = range(r * K, (r + 1) * K)
            samples = [{"completion": texts[i], "rewards": dict(zip(names, table[i])), "length": int(lengths[i]),
                        "correct": table[i][0] == table[i][0] and table[i][0] >= self.threshold,
                        "answer": self.extract(texts[i])} for i in span]
            correct = [s["correct"] for s in samples]
            record = {"index": played.start + r, "prompt": played.prompts[r * K], "correct": sum(correct),
                      "samples": samples, **{f"pass@{k}": pass_at_k(K, sum(correct), k) for k in self.ks}}
            if self.maj:
                answers = [s["answer"] for s in samples]
                record.update({f"maj@{k}": maj_at_k(answers, correct, k, answers_match) for k in self.ks})
            self.records.append(record)

    def result(self, names: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        records, K, ks = self.records, self.num_samples, self.ks
        n = max(len(records), 1)
        summary: dict[str, Any] = {"problems": len(records), "samples_per_problem": K,
                                   "pass@1": sum(r["correct"] for r in records) / (n * K)}
        for key in [f"pass@{k}" for k in ks] + ([f"maj@{k}" for k in ks] if self.maj else []):
            summary[key] = sum(r[key] for r in records) / n
        for name in names:
            values = [s["rewards"][name] for r in records for s in r["samples"] if s["rewards"][name] == s["rewards"][name]]
            summary[f"reward/{name}"] = sum(values) / len(values) if values else float("nan")
        summary["completion_length"] = sum(s["length"] for r in records for s in r["samples"]) / (n * K)
        return summary, records


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict[str, Any]], rewards: list[tuple[str, RewardFn]], *,
             max_new_tokens: int = 48, batch_size: int = 64, temperature: float = 0.0, seed: int = 0,
             timeout_s: float = 0.0, on_error: str = "raise", num_samples: int = 1,
             play: Callable[..., Played] = decode, summary: Any = None) -> Any:
    """Evaluate `model` on `rows`: the one evaluation of the package. By default the mean of each reward
    function over `rows` (e.g. {"accuracy": 0.41, "format": 0.99, ..., "completion_length": 31.2}).

    temperature 0 = greedy decoding (the default), otherwise sampled, keyed by `seed` and the row's index in
    `rows` (so it does not depend on `batch_size`). `timeout_s` and `on_error` bound and contain the reward
    calls as in training (``reward.timeout_s``, ``reward.reward_errors``). `play` makes a chunk's completions
    (:func:`decode`, or episodes with tools: grpo.training.episode_eval.Episodes); `summary` reduces them
    (:class:`RewardMeans` by default, :class:`PassAtK`, :class:`TextMetrics`, ...) and gives the result.
    """
    summary = RewardMeans() if summary is None else summary
    for start in range(0, len(rows), batch_size):
        played = play(model, tokenizer, rows[start:start + batch_size], start, max_new_tokens=max_new_tokens,
                      temperature=temperature, seed=seed, num_samples=num_samples)
        scored = score(rewards, played.weights, played.prompts, played.completions, played.columns,
                       on_error=on_error, timeout_s=timeout_s) if rewards else None
        summary.add(played, scored)
    return summary.result([name for name, _ in rewards])


def eval_rows(cfg, tokenizer, records=None) -> list[dict[str, Any]]:
    """The held-out rows of `train.eval_steps`: data.eval_dataset, else the API's `records`, else (embedded
    task only) 256 problems of the task's held-out split; a one-line ConfigError otherwise."""
    import dataclasses

    from grpo.config import ConfigError
    from grpo.data.prompts import load_prompts
    from grpo.data.tasks import TASKS

    if cfg.data.eval_dataset or records is not None:
        data = dataclasses.replace(cfg.data, dataset=cfg.data.eval_dataset)
        return load_prompts(data, cfg.train.seed, tokenizer, records=None if cfg.data.eval_dataset else records).rows
    if cfg.data.dataset:
        raise ConfigError("train.eval_steps needs data.eval_dataset (held-out prompts of your dataset)")
    return TASKS[cfg.data.task].generate("test", 256, seed=cfg.train.seed)


def eval_metrics(model, tokenizer, rows: list[dict[str, Any]], rewards: list[tuple[str, RewardFn]], cfg) -> dict[str, float]:
    """The `eval/` metrics of one evaluation during training (greedy, the run's rewards and limits)."""
    summary, _ = evaluate(model, tokenizer, rows, rewards, summary=PassAtK(1, [1]), temperature=0.0,
                          max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.train.seed,
                          timeout_s=cfg.reward.timeout_s, on_error=cfg.reward.reward_errors)
    return {f"eval/{k}": float(v) for k, v in summary.items() if k not in ("problems", "samples_per_problem")}
