"""`grpo sample`: rejection sampling to an SFT-ready JSONL file (grpo/training/rejection.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


#: The flags that decide the rows of a run: a --resume with any of them changed is refused (recorded next to --out).
SETTINGS = ("--model", "--dataset", "--split", "--task", "--num-samples", "--reward", "--keep", "--min-reward",
            "--max-per-prompt", "--dedupe", "--max-length", "--min-language", "--max-repetition", "--max-new-tokens",
            "--temperature", "--seed")


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="Rejection sampling: K completions per prompt, scored and filtered, "
                                      "streamed to an SFT-ready JSONL file.")
    p.add_argument("--model", help="Model directory or checkpoint (default: the embedded base policy).")
    p.add_argument("--dataset", help="Prompt dataset (default: the embedded task's train split).")
    p.add_argument("--split", default="train", help="Split of --dataset (default: train).")
    p.add_argument("--task", default="arithmetic", help="Embedded task without --dataset (default: arithmetic).")
    p.add_argument("--problems", type=int, default=0, help="Use the first N prompts (0 = all; the embedded "
                                                           "task: 256).")
    p.add_argument("--num-samples", dest="num_samples", type=int, default=4, help="Completions per prompt (K).")
    p.add_argument("--reward", action="append", help="Reward functions (the first decides `correct`; required "
                                                    "with --dataset).")
    p.add_argument("--keep", default="correct", help="correct (first reward >= --min-reward) | best (highest "
                                                     "total) | all.")
    p.add_argument("--min-reward", dest="min_reward", type=float, default=0.5)
    p.add_argument("--max-per-prompt", dest="max_per_prompt", type=int, default=0, help="0 = no cap.")
    p.add_argument("--dedupe", action="store_true", help="Keep one of identical completions of a prompt.")
    p.add_argument("--max-length", dest="max_length", type=int, default=0, help="Drop samples longer than this "
                                                                              "many tokens (0 = off).")
    p.add_argument("--min-language", dest="min_language", type=float, default=0.0,
                   help="Drop samples whose language-consistency share is below this (0 = off).")
    p.add_argument("--max-repetition", dest="max_repetition", type=float, default=1.0,
                   help="Drop samples whose repeated 4-gram fraction is above this (1 = off).")
    p.add_argument("--out", required=True, help="Output JSONL (rows: prompt, completion, rewards, columns).")
    p.add_argument("--resume", action="store_true", help="Continue an interrupted run on --out without duplicates.")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=16, help="Prompts per batch (and per write).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda when available, else cpu) | cpu | cuda | "
                   "cuda:N: where the model and any reward models run (as model.device).")
    p.set_defaults(func=cmd_sample)


def cmd_sample(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.cli.outputs import check_out_file
    from grpo.config import build_config
    from grpo.data.prompts import load_prompts
    from grpo.data.tasks import default_reward_functions, task_module
    from grpo.modeling.models import EMBEDDED_MODEL_DIR
    from grpo.rewards import load_reward
    from grpo.state.model_files import load_checkpoint
    from grpo.training.runtime import on_device
    from grpo.training.rejection import Selection, check_settings, resume_point, sample_to_file, select, write_settings

    if args.num_samples < 1 or args.temperature <= 0:
        raise ValueError("grpo sample needs --num-samples >= 1 and --temperature > 0")
    if args.problems < 0:
        raise ValueError(f"--problems must be >= 0 (0 = all), got {args.problems}")
    if args.max_new_tokens < 1 or args.batch_size < 1:
        raise ValueError(f"--max-new-tokens and --batch-size must be >= 1, got {args.max_new_tokens} and "
                         f"{args.batch_size}")
    task = None if args.dataset else task_module(args.task, "--task")
    selection = Selection(args.keep, args.min_reward, args.max_per_prompt, args.dedupe, args.max_length,
                          args.min_language, args.max_repetition)
    select([], selection)                                          # an unknown --keep fails before any work
    out = check_out_file(args.out, "--out")
    if out.exists() and not args.resume and out.stat().st_size > 0:
        raise FileExistsError(f"{out} exists: pass --resume to continue it, or choose another --out")
    settings = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in SETTINGS}
    if args.resume:
        check_settings(out, settings)          # an unreadable line or a changed flag: refused before any work
    cfg = build_config(overrides={"data.dataset": args.dataset or "", "data.split": args.split, "data.task": args.task,
                                  "train.seed": args.seed})
    rewards = [load_reward(r) for r in (args.reward or default_reward_functions(cfg, args.dataset))]
    model, tokenizer = load_checkpoint(args.model or str(EMBEDDED_MODEL_DIR))
    model = on_device(model, rewards, args.device)
    if args.dataset:
        rows = load_prompts(cfg.data, args.seed, tokenizer).rows
    else:
        rows = task.generate("train", args.problems or 256, seed=args.seed)
    rows = rows[:args.problems] if args.problems > 0 else rows
    out.parent.mkdir(parents=True, exist_ok=True)
    start = resume_point(out) if args.resume else 0
    write_settings(out, settings)
    counts = sample_to_file(model, tokenizer, rows, rewards, out, num_samples=args.num_samples, selection=selection,
                            max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                            batch_size=args.batch_size, start=start)
    print(f"grpo sample: {counts['prompts']} prompts (from prompt {start}), {counts['samples']} samples, "
          f"{counts['rows']} rows kept -> {out}")
    return 0
