"""`grpo sft`: supervised fine-tuning. With a dataset (``--dataset`` / ``data.dataset`` / ``--config``):
any causal LM on prompt/completion or messages rows (grpo/training/finetune.py), configured like
``grpo train``; without one, the embedded cold start (grpo/training/sft.py, its own flags)."""

from __future__ import annotations

import argparse

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
    from grpo.cli.main import Parser

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

    from grpo.training.sft import main as sft_main

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        sft_main(["--help"])
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
        from grpo.training.sft import main as sft_main

        return sft_main(extra, check_out=lambda path: check_out_dir(path, "--out"))
    from grpo.api.inputs import resolve_model
    from grpo.cli.main import parse_overrides
    from grpo.config import ConfigError, build_config, load_yaml
    from grpo.data.datasets_io import load_records, rename_columns
    from grpo.training.finetune import run_finetune
    from grpo.training.runtime import build_runtime

    known, rest = dataset_parser().parse_known_args(extra)
    flags = {"model.path": known.model, "data.dataset": known.dataset, "train.output_dir": known.output_dir,
             "train.max_steps": known.max_steps, "train.resume": "auto" if known.resume else None}
    cfg = build_config(load_yaml(known.config) if known.config else {},
                       {**parse_overrides(rest), **{k: v for k, v in flags.items() if v is not None}})
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
