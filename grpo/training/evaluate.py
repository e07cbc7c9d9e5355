"""Held-out evaluation: completions decoded exactly as in training (the rollout sampler and
grpo.training.experience.decode_completions), scored by reward functions. The one evaluator: `grpo eval`,
the Python API, the demo and `grpo sft` all decode through :func:`generate_texts`."""

from __future__ import annotations

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
    """Rows `chunk` (starting at row `start` of the evaluation) -> (PromptBatch, Generation, texts)."""
    from grpo.training.experience import decode_completions  # the same decoding as in training

    device = next(model.parameters()).device
    batch = tokenize_prompts(tokenizer, chunk, device)
    params = SamplingParams(n=num_samples, temperature=temperature, max_tokens=max_new_tokens,
                            stop_token_ids=eos_token_ids(tokenizer, model), seed=seed)
    gen = NativeEngine(model, tokenizer.pad_token_id).generate(
        batch.prompt_ids, batch.prompt_mask, params,
        prompt_index=torch.arange(start, start + len(chunk), device=device))                 # [b] row keys
    return batch, gen, decode_completions(tokenizer, gen)


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


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict[str, Any]], rewards: list[tuple[str, RewardFn]], *,
             max_new_tokens: int = 48, batch_size: int = 64, temperature: float = 0.0,
             seed: int = 0, timeout_s: float = 0.0, on_error: str = "raise") -> dict[str, float]:
    """Mean of each reward function over `rows` (e.g. {"accuracy": 0.41, "format": 0.99, ...}).

    temperature 0 = greedy decoding (the default), otherwise one sample per prompt, keyed by `seed` and the
    row's index in `rows` (so it does not depend on `batch_size`). `timeout_s` and `on_error` bound and
    contain the reward calls as in training (``reward.timeout_s``, ``reward.reward_errors``).
    """
    from grpo.training.experience import reward_columns

    sums = {name: 0.0 for name, _ in rewards}
    counts = {name: 0 for name, _ in rewards}
    lengths = 0.0
    for start in range(0, len(rows), batch_size):
        batch, gen, texts = _decode(model, tokenizer, rows[start:start + batch_size], start,
                                    max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        scored = score(rewards, None, batch.prompts, chat_completions(batch.prompts, texts),
                       reward_columns(batch.columns, gen), on_error=on_error, timeout_s=timeout_s)
        for k, name in enumerate(scored.names):
            col = scored.per_function[:, k]
            ok = ~torch.isnan(col)
            sums[name] += float(col[ok].sum())
            counts[name] += int(ok.sum())
        lengths += float(gen.completion_mask.sum())
    out = {name: sums[name] / max(counts[name], 1) for name in sums}
    out["completion_length"] = lengths / max(len(rows), 1)
    return out


@torch.no_grad()
def evaluate_samples(model, tokenizer, rows: list[dict[str, Any]], rewards: list[tuple[str, RewardFn]], *,
                     num_samples: int, ks: list[int], maj: bool = False, threshold: float = 0.5,
                     extract: Callable[[str], str | None] | None = None, max_new_tokens: int = 48,
                     batch_size: int = 64, temperature: float = 1.0, seed: int = 0, timeout_s: float = 0.0,
                     on_error: str = "raise") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`num_samples` completions per row, scored: (summary, one record per row).

    A sample is correct when the first reward function gives it >= `threshold`. The summary holds pass@1
    (mean correctness over all samples), unbiased pass@k for each k of `ks` (grpo.algorithms.sampling_metrics),
    maj@k with `maj` (answers from `extract`, default the last <answer> block or \\boxed{}, grouped by
    math-verify equivalence), every reward's mean and the mean completion length in tokens.
    """
    from grpo.rewards.math_answer import answers_match, final_answer
    from grpo.training.experience import repeat_each, reward_columns

    extract = extract or final_answer
    if any(not 1 <= k <= num_samples for k in ks):
        raise ValueError(f"every k must be in 1..{num_samples} (the samples per problem), got {ks}")
    names, records = [n for n, _ in rewards], []
    for start in range(0, len(rows), batch_size):
        batch, gen, texts = _decode(model, tokenizer, rows[start:start + batch_size], start,
                                    max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                    num_samples=num_samples)
        prompts = repeat_each(batch.prompts, num_samples)
        columns = {k: repeat_each(v, num_samples) for k, v in batch.columns.items()}
        scored = score(rewards, None, prompts, chat_completions(prompts, texts), reward_columns(columns, gen),
                       on_error=on_error, timeout_s=timeout_s)
        table = scored.per_function.tolist()                                  # [n * K, R]
        lengths = gen.completion_mask.sum(dim=1).tolist()                     # [n * K]
        for r in range(len(batch.prompts)):
            span = range(r * num_samples, (r + 1) * num_samples)
            samples = [{"completion": texts[i], "rewards": dict(zip(names, table[i])), "length": int(lengths[i]),
                        "correct": table[i][0] == table[i][0] and table[i][0] >= threshold,
                        "answer": extract(texts[i])} for i in span]
            correct = [s["correct"] for s in samples]
            record = {"index": start + r, "prompt": batch.prompts[r], "correct": sum(correct), "samples": samples,
                      **{f"pass@{k}": pass_at_k(num_samples, sum(correct), k) for k in ks}}
            if maj:
                answers = [s["answer"] for s in samples]
                record.update({f"maj@{k}": maj_at_k(answers, correct, k, answers_match) for k in ks})
            records.append(record)
    n = max(len(records), 1)
    summary: dict[str, Any] = {"problems": len(records), "samples_per_problem": num_samples,
                               "pass@1": sum(r["correct"] for r in records) / (n * num_samples)}
    for key in [f"pass@{k}" for k in ks] + ([f"maj@{k}" for k in ks] if maj else []):
        summary[key] = sum(r[key] for r in records) / n
    for j, name in enumerate(names):
        values = [s["rewards"][name] for r in records for s in r["samples"] if s["rewards"][name] == s["rewards"][name]]
        summary[f"reward/{name}"] = sum(values) / len(values) if values else float("nan")
    summary["completion_length"] = sum(s["length"] for r in records for s in r["samples"]) / (n * num_samples)
    return summary, records


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
    summary, _ = evaluate_samples(model, tokenizer, rows, rewards, num_samples=1, ks=[1], temperature=0.0,
                                  max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.train.seed,
                                  timeout_s=cfg.reward.timeout_s, on_error=cfg.reward.reward_errors)
    return {f"eval/{k}": float(v) for k, v in summary.items() if k not in ("problems", "samples_per_problem")}
