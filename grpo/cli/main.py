"""`grpo train | demo | eval | sft`: the command-line entry points (no training logic here)."""

from __future__ import annotations

import argparse
import os
import sys

from grpo.cli.common import FLAG_KEYS, Parser, parse_overrides, resolve_given, run_guarded, run_training
from grpo.cli.evaluation import add_parser as add_eval_parser
from grpo.cli.flow import add_parser as add_flow_parser
from grpo.cli.help_texts import add_rewards_help, preset_names
from grpo.cli.pipeline import add_parser as add_pipeline_parser
from grpo.cli.report import add_parser as add_report_parser
from grpo.cli.reward_model import add_parser as add_reward_model_parser
from grpo.cli.sample import add_parser as add_sample_parser
from grpo.cli.vllm_serve import add_parser as add_vllm_serve_parser
from grpo.config import field_help

TRAIN_EPILOG = """\
Any config key can be set as --section.key VALUE (VALUE is read as YAML: 0.1, true, [a, b]).
TRL GRPOConfig / `trl grpo` names work too, as flags (--learning_rate 1e-6, --use_peft, --reward_funcs a b)
and at the top level of --config FILE (docs/migrating-from-trl.md); a section.key always wins over a TRL name.
Precedence: defaults < --algorithm preset < --config FILE's sections < TRL names (file, then flags)
  < section.key (file, then flags) < the flags above.
Examples:
  grpo train                                   # embedded arithmetic task and base policy
  grpo train --config my.yaml --max-steps 50 --algorithm.beta 0.0 --rollout.num_generations 16
  grpo train --model ./my-model --dataset prompts.jsonl --reward my_rewards.py:correct
  grpo train --algorithm dapo --rollout.num_generations 16   # a preset; `grpo presets` lists them
  grpo train --config trl_recipe.yaml --learning_rate 1e-6   # a `trl grpo` recipe and TRL flag names
  grpo train --config my.yaml --resume         # continue from the newest valid checkpoint in output_dir
Ctrl-C / SIGTERM: the current step finishes, a checkpoint is saved, exit 130 / 143 (again: abort at once).
List every key with its default and meaning: grpo train --help-config
"""

CHECK_DESCRIPTION = """\
Score a JSONL file of completions with reward functions, without training; prints per function
the mean (over completions with a value), the share of None, the error count and n.

Completions file: one JSON object per line with
  completion   the text (or a list of chat messages), required
  prompt       the prompt, and any other columns inline (answer, language, completion_ids, ...)
  index        and/or a 0-based row number of --dataset: that row's columns are joined in
               (the completion row's own keys win)
Every row needs a prompt or an index. A column missing from some rows is None there.
Rewards are called by keyword as in training: fn(prompts=, completions=, **columns); a text
completion of a chat-message prompt is passed as [{"role": "assistant", "content": text}].
Example line: {"index": 3, "completion": "<think>...</think><answer>42</answer>"}
Weights and other reward/data keys come from --config and --section.key VALUE options.
"""


def config_from_args(args: argparse.Namespace, extra: list[str]):
    """grpo train's config: the --config file (sections, and TRL GRPOConfig keys at its top level), the TRL
    names given as flags, then --section.key options, then the named flags. A section.key always wins over
    a TRL name; the TRL keys are mapped together (grpo.config.trl), so batch keys combine across both."""
    flags = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items() if getattr(args, flag, None) is not None}
    if args.reward:
        flags["reward.functions"] = args.reward
    return resolve_given(args.config, extra, flags, world_size=int(os.environ.get("WORLD_SIZE", "1")))


def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    if args.help_config:
        for key, default, help_text in field_help():
            shown = repr(default) if isinstance(default, str) and not default.isprintable() else str(default)
            print(f"{key:34s} {shown:22s} {help_text}")
        return 0
    return run_training(config_from_args(args, extra), args.argv)      # the Python API: one path for both


#: `grpo demo --task NAME` -> (module, function, default output directory).
DEMOS = {"arithmetic": ("grpo.cli.demo", "run_demo", "runs/demo"),
         "calculator": ("grpo.cli.demo_calculator", "run_calculator_demo", "runs/demo-calculator"),  # tool use
         "shapes-vqa": ("grpo.cli.demo_shapes_vqa", "run_shapes_vqa_demo", "runs/demo-shapes-vqa")}  # docs/vlm.md


def cmd_demo(args: argparse.Namespace, extra: list[str]) -> int:
    import importlib

    module, function, default_out = DEMOS[args.task]
    run = getattr(importlib.import_module(module), function)
    run(args.out or default_out, steps=args.steps, eval_problems=args.eval_problems, seed=args.seed,
        overrides=parse_overrides(extra))
    return 0


def cmd_presets(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.config.presets import format_presets

    print(format_presets(), end="")
    return 0


def cmd_export(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.state.export import export_merged

    out = export_merged(args.checkpoint, args.out_dir, dtype=args.dtype)
    print(f"exported {args.checkpoint} -> {out} (load with AutoModelForCausalLM.from_pretrained)")
    return 0


def cmd_rewards_check(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.cli.rewards_check import check_config, run_check

    cfg = check_config(args.config, args.reward, args.dataset, args.reward_errors, extra)
    print(run_check(cfg, args.completions))
    return 0


def cmd_sft(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.cli.sft import cmd_sft as run

    return run(args, extra)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="grpo", description="Post-train language models with GRPO.")
    parser.add_argument("--debug", action="store_true", help="Show full tracebacks on errors.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="Run GRPO training.", epilog=TRAIN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config file (sections: model, lora, data, rollout, reward, algorithm, optim, train, log, health).")
    p.add_argument("--model", help="Local Hugging Face model directory (default: the embedded base policy).")
    p.add_argument("--dataset", help="Prompt dataset: .jsonl/.json/.csv/.parquet or a save_to_disk directory (default: the embedded arithmetic task).")
    p.add_argument("--reward", action="append", help="Reward function: a built-in name, file.py:function, package.module.function or a "
                   "reward-model directory (repeatable).")
    p.add_argument("--output-dir", dest="output_dir", help="Output directory (metrics.jsonl, config.yaml, checkpoint).")
    p.add_argument("--max-steps", dest="max_steps", type=int, help="Number of GRPO steps.")
    p.add_argument("--seed", type=int, help="Random seed.")
    p.add_argument("--algorithm", help=f"Algorithm preset: {preset_names()} (`grpo presets` shows each one's "
                                       "settings; explicit options override it).")
    p.add_argument("--resume", nargs="?", const="auto", metavar="PATH",
                   help="Continue the run from the newest valid checkpoint in the output directory (train.resume=auto; "
                        "a corrupted newest one is skipped with a warning), or from the checkpoint PATH.")
    p.add_argument("--help-config", action="store_true", help="List every config key with its default and help.")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="Evaluate the base policy, run GRPO, evaluate again (embedded task).",
                       epilog="Extra --section.key VALUE options override the demo's training config.")
    p.add_argument("--out", default=None, help="Output directory (default: runs/demo, runs/demo-calculator or runs/demo-shapes-vqa).")
    p.add_argument("--task", choices=list(DEMOS), default="arithmetic",
                   help="arithmetic (default) | calculator: multi-turn episodes with a calc() tool (docs/agents.md) "
                        "| shapes-vqa: GRPO on a tiny vision-language model answering questions about images (docs/vlm.md).")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the demo's setting).")
    p.add_argument("--eval-problems", dest="eval_problems", type=int, default=256,
                   help="Held-out problems evaluated before and after (default: 256).")
    p.add_argument("--seed", type=int, default=0, help="Random seed (default: 0).")
    p.set_defaults(func=cmd_demo)

    add_eval_parser(sub)
    add_sample_parser(sub)
    add_reward_model_parser(sub)
    add_pipeline_parser(sub)
    add_report_parser(sub)
    add_flow_parser(sub)
    add_vllm_serve_parser(sub)

    p = sub.add_parser("presets", help="Print every algorithm preset (paper and settings).")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("export", help="Write a checkpoint (full model or LoRA adapter) as one merged model "
                                      "+ tokenizer that plain from_pretrained loads.")
    p.add_argument("checkpoint", help="Checkpoint directory (e.g. runs/train/checkpoint-100).")
    p.add_argument("out_dir", help="Output directory (must not exist or be empty).")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="Parameter dtype of the export (default: the dtype stored with the model).")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("rewards", help="Reward-function tools (`grpo rewards check --help`); `grpo rewards --help` "
                                       "lists the built-in rewards.", add_help=False)
    add_rewards_help(p)
    rewards = p.add_subparsers(dest="rewards_command", required=True)
    p = rewards.add_parser("check", help="Score a JSONL file of completions with reward functions (no training).",
                           description=CHECK_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--completions", required=True, help="JSONL file of completions (format above).")
    p.add_argument("--reward", action="append", help="Reward function: a built-in name (optionally name:key=value,...), "
                                                     "file.py:function or a reward-model directory (repeatable; "
                                                     "default: reward.functions of the config).")
    p.add_argument("--dataset", help="Dataset the completions' 'index' points into (default: data.dataset).")
    p.add_argument("--config", help="YAML config file (reward and data sections are used).")
    p.add_argument("--reward-errors", dest="reward_errors", choices=["raise", "zero"],
                   help="A reward function that fails: raise (stop, default) | zero (count as 0.0).")
    p.set_defaults(func=cmd_rewards_check)

    p = sub.add_parser("sft", help="Supervised fine-tuning: --dataset (prompt/completion or messages) on any "
                                   "model with grpo train's config, or without one the embedded cold start "
                                   "(`grpo sft --help`).", add_help=False)
    p.set_defaults(func=cmd_sft)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = list(argv)
    if args.command in ("eval", "export", "sample", "reward-model", "pipeline", "report") and extra:
        parser.error(f"unrecognised arguments: {' '.join(extra)}")
    from grpo.training.cpu_runtime import warm_vml

    warm_vml()        # every command: eval and sample run the model without a runtime (grpo/cpu/vml_warmup.py)
    return run_guarded(lambda: args.func(args, extra), debug=args.debug)
