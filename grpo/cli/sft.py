"""`grpo sft`: supervised fine-tuning. With a dataset (``--dataset`` / ``data.dataset`` / ``--config``):
any causal LM on prompt/completion or messages rows (grpo/training/finetune.py), configured like
``grpo train``; without one, the embedded cold start (grpo/training/sft.py, its own flags: cold_start_main, also
``python -m grpo.training.sft``). vlm_main is ``python -m grpo.training.vlm_sft`` (grpo/training/vlm_sft.py)."""

from __future__ import annotations

import argparse

from grpo.cli.common import Parser, parse_overrides

GENERAL = ("--dataset", "--data.dataset", "--config")


USAGE = """\
grpo sft --dataset FILE [--model DIR] [--output-dir DIR] [--max-steps N] [--resume] [--config FILE]
                [--section.key VALUE ...]
       grpo sft --out DIR [--steps N] [--batch-size N] [--lr LR] [--task TASK] ...   (no dataset: the cold start)"""

DESCRIPTION = """\
Supervised fine-tuning, in one of two modes. With a dataset (--dataset, data.dataset or --config): any causal LM
on prompt + completion or messages rows, configured like grpo train (its config keys, checkpoints, --resume).
Without one: the embedded cold start of a small policy on the embedded task's demonstrations (--out)."""

EPILOG = """\
Examples:
  grpo sft --model ./my-hf-model --dataset sft.jsonl --output-dir runs/sft --max-steps 500 --optim.lr 1e-5
  grpo sft --model ./my-hf-model --dataset sft.jsonl --output-dir runs/sft --max-steps 500 --resume
  grpo sft --out ./cold-start --steps 1000
"""


def dataset_parser(for_help: bool = False):
    """The options of the dataset mode (the help shows them beside the cold start's, and the config keys)."""
    parser = Parser(prog="grpo sft", usage=USAGE, description=DESCRIPTION, epilog=EPILOG, add_help=False,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("with a dataset (any model, grpo train's config)")
    group.add_argument("--config", help="YAML config (the sections of grpo train).")
    group.add_argument("--model", help="Model directory (model.path).")
    group.add_argument("--dataset", help="SFT rows: prompt + completion columns, or messages (data.dataset).")
    group.add_argument("--output-dir", dest="output_dir", help="train.output_dir.")
    group.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps.")
    group.add_argument("--resume", action="store_true", help="Continue from the newest checkpoint (train.resume auto).")
    if for_help:                                                  # parsed by parse_overrides, not here
        group.add_argument("--section.key", dest="section_key", metavar="VALUE",
                           help="Any config key of grpo train, e.g. --optim.lr 1e-5 --train.micro_batch_size 16 "
                                "--lora.enabled true (`grpo train --help-config` lists them).")
    return parser


def sft_help() -> str:
    """Both modes' options: the dataset mode's, then the cold start's (grpo/training/sft.py's own parser)."""
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        cold_start_main(["--help"])
    cold = text.getvalue().partition("\noptions:\n")[2]
    cold = "\n".join(line for line in cold.splitlines() if not line.lstrip().startswith("-h, --help"))
    head, _, tail = dataset_parser(for_help=True).format_help().partition("\nExamples:")
    return (f"{head.rstrip()}\n\nwithout a dataset (the embedded cold start, grpo/training/sft.py):\n{cold}\n"
            f"  -h, --help            show this help message and exit\n\nExamples:{tail}")


def cmd_sft(args: argparse.Namespace, extra: list[str]) -> int:
    if any(a in ("-h", "--help") for a in extra):
        print(sft_help(), end="")
        return 0
    if not any(a.split("=")[0] in GENERAL for a in extra):
        from grpo.cli.outputs import check_out_dir
        return cold_start_main(extra, check_out=lambda path: check_out_dir(path, "--out"))
    from grpo.config import build_config, load_yaml

    known, rest = dataset_parser().parse_known_args(extra)
    flags = {"model.path": known.model, "data.dataset": known.dataset, "train.output_dir": known.output_dir,
             "train.max_steps": known.max_steps, "train.resume": "auto" if known.resume else None}
    cfg = build_config(load_yaml(known.config) if known.config else {},
                       {**parse_overrides(rest), **{k: v for k, v in flags.items() if v is not None}})
    return sft_from_config(cfg)


def sft_from_config(cfg) -> int:
    """`grpo sft` with a dataset, its Config built (`grpo pipeline`'s sft stages call this too)."""
    from grpo.api.inputs import resolve_model
    from grpo.config import ConfigError
    from grpo.data.datasets_io import load_records, rename_columns
    from grpo.training.finetune import run_finetune
    from grpo.training.runtime import build_runtime

    if not cfg.data.dataset:
        raise ConfigError("grpo sft: data.dataset (--dataset) names no file")
    if cfg.train.max_steps < 1:
        raise ConfigError(f"grpo sft: train.max_steps (--max-steps) must be >= 1, got {cfg.train.max_steps}")
    records = load_records(cfg.data.dataset, cfg.data.split, cfg.data.skip_bad_rows)
    rename_columns(records, dict(cfg.data.column_map))
    runtime = build_runtime(cfg)
    runtime.prepare_process()
    model, tokenizer = resolve_model(cfg.model.path or None, None, cfg, runtime)
    result = run_finetune(cfg, model, tokenizer, records.rows)
    if result["first_loss"] != result["first_loss"]:                 # resumed at train.max_steps: nothing to do
        print(f"grpo sft: already at step {result['steps']} of {cfg.train.max_steps}; checkpoint: {result['checkpoint']}")
        return 0
    print(f"grpo sft: {result['steps']} steps, loss {result['first_loss']:.4f} -> {result['final_loss']:.4f}; "
          f"checkpoint: {result['checkpoint']}")
    return 0


def _fmt(stats: dict) -> str:
    return "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items())


def cold_start_parser() -> Parser:
    parser = Parser(
        prog="grpo sft",
        description="Cold-start SFT of a small character-level Qwen2 policy on arithmetic demonstrations "
        "that mix worked (<think>a+b=c,...</think>) and direct (<think></think>) solutions.",
    )
    parser.add_argument("--out", required=True, help="output directory (model + tokenizer, save_pretrained format)")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per step (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (default: %(default)s)")
    parser.add_argument("--task", choices=["arithmetic", "calculator"], default="arithmetic",
                        help="embedded task of the demonstrations (calculator: tool episodes, docs/agents.md)")
    parser.add_argument("--worked-fraction", type=float, default=0.45,
                        help="share of demonstrations that show worked steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data, init and shuffling (default: %(default)s)")
    parser.add_argument("--size", choices=["small", "micro"], default="small", help="model preset (default: %(default)s)")
    parser.add_argument("--num-examples", type=int, default=40_000, help="demonstrations drawn from the train split (default: %(default)s)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="linear warmup steps (default: 5%% of --steps)")
    parser.add_argument("--log-every", type=int, default=50, help="print the running loss every N steps (default: %(default)s)")
    parser.add_argument("--eval-n", type=int, default=0,
                        help="after training, evaluate on N held-out test problems, greedy and sampled (default: off)")
    parser.add_argument("--eval-samples", type=int, default=4, help="samples per problem for the sampled evaluation (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice; 1 is faster on a busy machine)")
    return parser


def cold_start_main(argv: list[str] | None = None, check_out=None) -> int:
    """Command line: train the cold-start policy, save it, optionally evaluate on held-out problems.
    `check_out(path)` (grpo sft passes one) refuses an --out it must not write to, before any work."""
    import torch

    from grpo.data.tasks import arithmetic
    from grpo.training.sft import evaluate_greedy, evaluate_sampled, run_sft

    parser = cold_start_parser()
    args = parser.parse_args(argv)
    for flag, value, low in (("--steps", args.steps, 1), ("--batch-size", args.batch_size, 1),
                             ("--num-examples", args.num_examples, 1), ("--log-every", args.log_every, 1),
                             ("--eval-n", args.eval_n, 0), ("--eval-samples", args.eval_samples, 1)):
        if value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    if not args.lr > 0 or not 0 <= args.worked_fraction <= 1:
        parser.error(f"--lr must be > 0 and --worked-fraction in [0, 1], got {args.lr} and {args.worked_fraction}")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        parser.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if check_out is not None:
        check_out(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    stats = run_sft(
        args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr, worked_fraction=args.worked_fraction,
        seed=args.seed, size=args.size, num_examples=args.num_examples, warmup_steps=args.warmup_steps,
        log_every=args.log_every, task=args.task,
    )
    print(f"sft: final loss {stats['final_loss']:.4f}, {stats['wall_seconds']:.1f}s")
    if args.eval_n and args.task == "arithmetic":
        from grpo.modeling.models import load_policy

        model, tokenizer = load_policy(args.out)
        rows = arithmetic.generate("test", args.eval_n, seed=args.seed)
        print("greedy :", _fmt(evaluate_greedy(model, tokenizer, rows)))
        print("sampled:", _fmt(evaluate_sampled(model, tokenizer, rows, num_samples=args.eval_samples, seed=args.seed)))
    return 0


def weighted_qtypes(spec: str) -> tuple[str, ...]:
    """"count=6,where=1" -> each named type repeated by its weight, unnamed types once ("" -> every type once)."""
    from grpo.data.tasks import shapes_vqa

    weights = {q: 1 for q in shapes_vqa.QUESTIONS}
    for part in filter(None, spec.split(",")):
        name, _, w = part.partition("=")
        if name not in weights or not w.isdigit():
            raise ValueError(f"--qtype-weights: cannot read {part!r} (NAME=INTEGER, NAME one of {', '.join(weights)})")
        weights[name] = int(w)
    return tuple(q for q, w in weights.items() for _ in range(w))


def vlm_main(argv: list[str] | None = None) -> int:
    """``python -m grpo.training.vlm_sft``: train the tiny VLM on shapes VQA demonstrations, evaluate it greedy and
    sampled on held-out questions, save it and sft_report.json to --out."""
    import json
    import time
    from pathlib import Path

    import torch

    from grpo.data.tasks import shapes_vqa
    from grpo.modeling.vlm import save_vlm, vision_rows
    from grpo.training import vlm_sft

    p = argparse.ArgumentParser(prog="python -m grpo.training.vlm_sft", description=vlm_sft.__doc__.splitlines()[0])
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
    model, tokenizer, processor, log = vlm_sft.run_vlm_sft(
        a.steps, a.batch_size, a.lr, a.seed, a.num_examples, worked_fraction=a.worked_fraction,
        qtypes=weighted_qtypes(a.qtype_weights), size={"vision_hidden": a.vision_hidden}, patch_size=a.patch_size,
        direct_noise=a.direct_noise, init=a.init)
    train_s = time.perf_counter() - t0
    held = vision_rows(shapes_vqa.generate("test", a.eval_examples, seed=0), processor, model)
    greedy = vlm_sft.evaluate(model, tokenizer, held)
    sampled = vlm_sft.evaluate(model, tokenizer, held, temperature=1.0, num_generations=4)
    save_vlm(model, tokenizer, processor, a.out)
    report = {"train_s": round(train_s, 1), "greedy": greedy, "sampled_t1": sampled, "log": log, "args": vars(a)}
    Path(a.out, "sft_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({"train_s": report["train_s"], "greedy": greedy["accuracy"], "sampled": sampled["accuracy"],
                      "per_type_greedy": greedy["per_type"],
                      **{f"{k}_{m}": v for k, d in (("greedy", greedy), ("sampled", sampled))
                         for m, v in d.items() if m.startswith(("worked", "direct"))}}))
    return 0
