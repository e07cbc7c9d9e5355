"""`grpo eval`: mean rewards of a policy's completions, or with several samples per problem pass@k and
maj@k, on a dataset or on the embedded task's held-out split."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="Mean rewards of a policy's completions on a dataset or the embedded task's "
                                    "held-out split; with --samples K, pass@k and maj@k.")
    p.add_argument("--model", help="Model directory or checkpoint (default: the embedded base policy).")
    p.add_argument("--dataset", help="Prompt dataset (file or saved dataset; its other columns reach the rewards). "
                                     "Default: the embedded task's held-out split.")
    p.add_argument("--split", default="train", help="Split of --dataset (default: train).")
    p.add_argument("--task", default="arithmetic", help="Embedded task without --dataset (default: arithmetic).")
    p.add_argument("--problems", type=int, default=256,
                   help="Problems: held-out ones of the task (>= 1), or the first N rows of --dataset (0 = all; "
                        "default 256).")
    p.add_argument("--reward", action="append", help="Reward functions (the task's own without --dataset: accuracy, "
                                                    "format; required with --dataset). The first decides correctness.")
    p.add_argument("--samples", type=int, default=1, help="Completions per problem (K > 1 needs --temperature > 0).")
    p.add_argument("--k", default="", help="Comma-separated k of pass@k (and maj@k), each <= --samples "
                                           "(default: 1 and --samples).")
    p.add_argument("--maj", action="store_true", help="Also maj@k: a vote over the extracted answers, equivalent "
                                                      "answers grouped by math-verify.")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="A sample is correct when the first reward gives it >= this (default 0.5).")
    p.add_argument("--answer-extractor", default="", help="file.py:function(text) -> answer or None for maj@k "
                                                          "(default: the last <answer> block, else \\boxed{}).")
    p.add_argument("--out", help="Directory for samples.jsonl (one row per problem) and summary.json: a new one or "
                                 "an earlier evaluation's (a training run's directory is refused).")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda when available, else cpu) | cpu | cuda | "
                   "cuda:N: where the model and any reward models run (as model.device).")
    p.set_defaults(func=cmd_eval)


def _ks(text: str, samples: int) -> list[int]:
    try:
        ks = sorted({int(k) for k in text.split(",") if k.strip()}) if text else sorted({1, samples})
    except ValueError:
        raise ValueError(f"--k must be comma-separated integers, got {text!r}") from None
    if any(not 1 <= k <= samples for k in ks):
        raise ValueError(f"--k: every k must be in 1..--samples ({samples}), got {text}")
    return ks


def named_extractor(fn, spec: str):
    """`fn` with its failures as one-line errors naming the --answer-extractor function and file."""

    def extract(text):
        try:
            return fn(text)
        except Exception as e:
            raise ValueError(f"--answer-extractor {spec} failed: {type(e).__name__}: {e}") from e

    return extract


def cmd_eval(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.config import build_config
    from grpo.data.prompts import load_prompts
    from grpo.data.tasks import default_reward_functions
    from grpo.modeling.models import EMBEDDED_MODEL_DIR
    from grpo.rewards import load_reward
    from grpo.rewards import load_file_reward
    from grpo.state.model_files import load_checkpoint
    from grpo.training.runtime import on_device
    from grpo.training.evaluate import PassAtK, evaluate

    from grpo.cli.outputs import check_out_dir
    from grpo.data.tasks import task_module

    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    if args.problems < 0:
        raise ValueError(f"--problems must be >= 0 (0 = all rows of --dataset), got {args.problems}")
    if args.problems == 0 and not args.dataset:
        raise ValueError("--problems 0 (all rows) needs --dataset: the embedded task's held-out split has no end")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    task = None if args.dataset else task_module(args.task, "--task")
    if args.out:
        check_out_dir(args.out, "--out")       # a file, or a training run's directory: refused before any work
    if args.samples > 1 and args.temperature <= 0:
        raise ValueError("--samples > 1 needs --temperature > 0 (greedy samples are all the same)")
    ks = _ks(args.k, args.samples)
    extract = None
    if args.answer_extractor:
        path, sep, name = args.answer_extractor.rpartition(":")
        if not sep or not path.endswith(".py"):
            raise ValueError(f"--answer-extractor must be file.py:function, got {args.answer_extractor!r}")
        extract = named_extractor(load_file_reward(path, name)[1], args.answer_extractor)
    cfg = build_config(overrides={"data.dataset": args.dataset or "", "data.split": args.split, "data.task": args.task,
                                  "train.seed": args.seed})
    rewards = [load_reward(r) for r in (args.reward or default_reward_functions(cfg, args.dataset))]
    model, tokenizer = load_checkpoint(args.model or str(EMBEDDED_MODEL_DIR))  # full model or LoRA adapter
    model = on_device(model, rewards, args.device)
    if args.dataset:
        rows = load_prompts(cfg.data, args.seed, tokenizer).rows
        rows = rows[:args.problems] if args.problems > 0 else rows
    else:
        rows = task.generate("test", args.problems, seed=args.seed)
    per_problem = args.samples > 1 or args.maj or args.out     # pass@k, maj@k, samples.jsonl: one record per row
    result = evaluate(model, tokenizer, rows, rewards, max_new_tokens=args.max_new_tokens,
                      temperature=args.temperature, seed=args.seed, num_samples=args.samples,
                      summary=PassAtK(args.samples, ks, args.maj, args.threshold, extract) if per_problem else None)
    if not per_problem:
        for name, value in result.items():
            print(f"{name:20s} {value:.4f}")
        return 0
    summary, records = result
    for name, value in summary.items():
        print(f"{name:20s} {value:.4f}" if isinstance(value, float) else f"{name:20s} {value}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "samples.jsonl").open("w") as fh:
            for record in records:
                fh.write(json.dumps(record) + "\n")
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
        (out / "summary.json").write_text(json.dumps(clean, indent=1) + "\n")
    return 0
