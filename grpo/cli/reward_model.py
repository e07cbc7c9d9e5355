"""`grpo reward-model`: train a single-logit reward model on completions labelled by a reward function
(grpo/training/reward_model_training.py); the output directory is a reward (`--reward DIR`)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SKIP = ("prompt", "completion", "reward", "rewards", "prompt_index", "sample")


def add_parser(sub) -> None:
    p = sub.add_parser("reward-model", help="Train a reward model on labelled completions (e.g. grpo sample "
                                            "--keep all output); the result loads as --reward DIR.")
    p.add_argument("--samples", required=True, help="JSONL rows with prompt, completion and other columns.")
    p.add_argument("--label", required=True, help="Reward function whose value >= --threshold labels a row good.")
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--base", help="Causal LM directory whose backbone the reward model starts from "
                                  "(default: the embedded base policy).")
    p.add_argument("--out", required=True, help="Output directory (model + tokenizer; must not exist or be empty).")
    p.add_argument("--loss", default="pointwise", help="pointwise (BCE) | pairwise (Bradley-Terry).")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--held-out", dest="held_out", type=float, default=0.2, help="Share of rows kept for accuracy.")
    p.add_argument("--history", help="Samples of earlier iterations (JSONL, labelled the same way), replayed into "
                                     "every batch (DeepSeekMath's iterative RL: --replay 0.1).")
    p.add_argument("--replay", type=float, default=0.1, help="Share of every batch drawn from --history (default 0.1).")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_reward_model)


def read_samples(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"samples file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: invalid JSON ({e.msg})") from None
        if not isinstance(row, dict) or "prompt" not in row or "completion" not in row:
            raise ValueError(f"{path}:{n}: a row needs 'prompt' and 'completion'")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def check_args(args: argparse.Namespace, losses: tuple[str, ...]) -> None:
    """The numeric flags and --loss, checked before any model is loaded."""
    if args.loss not in losses:
        raise ValueError(f"--loss must be one of {' | '.join(losses)}, got {args.loss!r}")
    problems = [(args.steps >= 1, f"--steps must be >= 1, got {args.steps}"),
                (args.batch_size >= 1, f"--batch-size must be >= 1, got {args.batch_size}"),
                (args.lr > 0, f"--lr must be > 0, got {args.lr}"),
                (0 <= args.held_out < 1, f"--held-out must be in [0, 1), got {args.held_out}"),
                (0 <= args.replay <= 1, f"--replay must be in [0, 1], got {args.replay}")]
    for ok, message in problems:
        if not ok:
            raise ValueError(message)


def check_out(path: str) -> Path:
    """--out: a new or empty directory (as grpo export's), so no model or file is overwritten."""
    from grpo.cli.outputs import check_parent

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file: give a new or empty directory for the reward model")
    if out.is_dir() and any(out.iterdir()):
        raise FileExistsError(f"--out {out} is not empty: give a new or empty directory for the reward model")
    check_parent(out, "--out")
    return out


def cmd_reward_model(args: argparse.Namespace, extra: list[str]) -> int:
    import torch

    from grpo.modeling.models import EMBEDDED_MODEL_DIR, load_tokenizer
    from grpo.rewards import load_reward, score
    from grpo.rewards.reward_model import reward_text
    from grpo.rewards.text import chat_completions
    from grpo.training.reward_model_training import (LOSSES, ReplayBuffer, accuracy, new_reward_model,
                                                     train_reward_model)

    check_args(args, LOSSES)
    out = check_out(args.out)
    label = load_reward(args.label)
    base = args.base or str(EMBEDDED_MODEL_DIR)
    tokenizer = load_tokenizer(base)

    def labelled(path: str) -> list:
        rows = read_samples(Path(path))
        prompts, completions = [r["prompt"] for r in rows], [r["completion"] for r in rows]
        columns = {k: [r.get(k) for r in rows] for k in sorted({k for r in rows for k in r} - set(SKIP))}
        values = score([label], None, prompts, chat_completions(prompts, completions), columns).per_function[:, 0]
        return [(*reward_text(tokenizer, p, c), int(v == v and v >= args.threshold))
                for p, c, v in zip(prompts, completions, values.tolist())]

    items = labelled(args.samples)
    history = ReplayBuffer(labelled(args.history)) if args.history else None
    torch.manual_seed(args.seed)
    model = new_reward_model(base, tokenizer)
    random.Random(args.seed).shuffle(items)
    cut = int(len(items) * (1 - args.held_out))
    train, held = items[:cut], items[cut:]
    if not train:
        raise ValueError(f"{args.samples}: its {len(items)} rows leave none to train on after --held-out {args.held_out}")
    before = accuracy(model, tokenizer, held) if held else float("nan")
    losses = train_reward_model(model, tokenizer, train, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                loss=args.loss, history=history, replay=args.replay if history else 0.0,
                                seed=args.seed)
    after = accuracy(model, tokenizer, held) if held else float("nan")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    good = sum(it[2] for it in items)
    print(f"grpo reward-model: {len(items)} rows ({good} good), {args.steps} steps, final loss {losses[-1]:.4f}; "
          f"held-out accuracy {before:.3f} -> {after:.3f}; saved {out}")
    return 0
