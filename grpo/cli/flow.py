"""`grpo flow train | demo`: Flow-GRPO for flow-matching image generators (grpo/flow/, docs/flow.md)."""

from __future__ import annotations

import argparse
import sys

from grpo.cli.common import parse_overrides, resume_command
from grpo.config import build_config, load_yaml

FLOW_EPILOG = """\
Config keys as in `grpo train`: --config FILE, --section.key VALUE (the flow section: flow.noise_level,
flow.train_steps, flow.eval_steps, flow.variant, flow.beta, flow.guidance_scale, ...; `grpo train
--help-config` lists them all). Examples:
  grpo flow train --max-steps 40 --optim.lr 3e-4 --flow.variant mix_grpo --output-dir runs/flow
  grpo flow train --output-dir runs/flow --resume
  grpo flow demo --out runs/flow-demo
"""


def add_parser(sub) -> None:
    p = sub.add_parser("flow", help="Flow-GRPO for flow-matching image generators (`grpo flow train|demo`).")
    flow = p.add_subparsers(dest="flow_command", required=True)
    t = flow.add_parser("train", help="Train a flow model with Flow-GRPO.", epilog=FLOW_EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", help="YAML config file (the flow section and the shared train/optim/log/health ones).")
    t.add_argument("--model", help="Flow model directory (flow.model; default: grpo/assets/shapes-flow).")
    t.add_argument("--output-dir", dest="output_dir", help="Output directory (metrics.jsonl, config.yaml, checkpoints).")
    t.add_argument("--max-steps", dest="max_steps", type=int, help="Flow-GRPO steps.")
    t.add_argument("--seed", type=int, help="Random seed.")
    t.add_argument("--resume", nargs="?", const="auto", metavar="PATH",
                   help="Continue from the newest valid checkpoint of the output directory, or from PATH.")
    t.set_defaults(func=cmd_flow_train)
    d = flow.add_parser("demo", help="Evaluate the base flow model, run Flow-GRPO, evaluate again (shapes world).",
                        epilog="Extra --section.key VALUE options override the demo's config.")
    d.add_argument("--out", default="runs/flow-demo", help="Output directory (default: runs/flow-demo).")
    d.add_argument("--steps", type=int, default=None, help="Flow-GRPO steps (default: the demo's setting).")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_flow_demo)


def cmd_flow_train(args: argparse.Namespace, extra: list[str]) -> int:
    import torch

    from grpo.flow.loop import run_flow

    overrides = parse_overrides(extra)
    for flag, key in (("model", "flow.model"), ("output_dir", "train.output_dir"), ("max_steps", "train.max_steps"),
                      ("seed", "train.seed"), ("resume", "train.resume")):
        if getattr(args, flag, None) is not None:
            overrides[key] = getattr(args, flag)
    cfg = build_config(load_yaml(args.config) if args.config else {}, overrides)
    if cfg.cpu.num_threads:
        torch.set_num_threads(cfg.cpu.num_threads)
    result = run_flow(cfg)
    if result.stopped_by:
        print(f"grpo: stopped by {result.stopped_by} after step {result.steps} of {cfg.train.max_steps}; checkpoint: "
              f"{result.checkpoint or 'none'}\nresume with: {resume_command(args.argv)}", file=sys.stderr)
        return 128 + result.signum
    print(f"done: {result.steps} steps in {result.wall_s:.0f}s; metrics in {result.output_dir / cfg.log.metrics_file}"
          + (f"; model saved to {result.checkpoint}" if result.checkpoint else ""))
    return 0


def cmd_flow_demo(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.flow.demo import run_flow_demo

    run_flow_demo(args.out, steps=args.steps, seed=args.seed, overrides=parse_overrides(extra))
    return 0
