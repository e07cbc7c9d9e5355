"""`grpo sft`: supervised fine-tuning. With a dataset (``--dataset`` / ``data.dataset`` / ``--config``):
any causal LM on prompt/completion or messages rows (grpo/training/finetune.py), configured like
``grpo train``; without one, the embedded cold start (grpo/training/sft.py, its own flags)."""

from __future__ import annotations

import argparse

GENERAL = ("--dataset", "--data.dataset", "--config")


def cmd_sft(args: argparse.Namespace, extra: list[str]) -> int:
    if not any(a.split("=")[0] in GENERAL for a in extra):
        from grpo.cli.outputs import check_out_dir
        from grpo.training.sft import main as sft_main

        return sft_main(extra, check_out=lambda path: check_out_dir(path, "--out"))
    from grpo.api.inputs import resolve_model
    from grpo.cli.main import Parser, parse_overrides
    from grpo.config import ConfigError, build_config, load_yaml
    from grpo.data.datasets_io import load_records, rename_columns
    from grpo.training.finetune import run_finetune
    from grpo.training.runtime import build_runtime

    parser = Parser(prog="grpo sft", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config (the sections of grpo train).")
    parser.add_argument("--model", help="Model directory (model.path).")
    parser.add_argument("--dataset", help="SFT rows: prompt + completion columns, or messages (data.dataset).")
    parser.add_argument("--output-dir", dest="output_dir", help="train.output_dir.")
    parser.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps.")
    parser.add_argument("--resume", action="store_true", help="Continue from the newest checkpoint (train.resume auto).")
    known, rest = parser.parse_known_args(extra)
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
