"""`grpo demo`: evaluate the base policy, run GRPO on the embedded task, evaluate again.

Writes DIR/summary.json, DIR/metrics.jsonl, DIR/curves.png and DIR/report.html (grpo report).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from grpo.cli.plots import plot_curves
from grpo.config import Config, demo_config, demo_output_dir

# The demo's training settings (every other key keeps its default; see `grpo train --help-config`).
DEMO_CONFIG: dict[str, dict[str, Any]] = {
    "rollout": {"num_generations": 8, "max_new_tokens": 40, "temperature": 1.0},
    "algorithm": {"beta": 0.04, "epsilon": 0.2},
    "optim": {"lr": 3e-5, "warmup_steps": 5, "max_grad_norm": 1.0},
    # one CPU thread: for a 0.8M-parameter model, thread hand-offs cost more than they save,
    # and on a shared machine two threads per process thrash
    "train": {"prompts_per_step": 16, "max_steps": 150},
    "cpu": {"num_threads": 1},
}


def demo_settings(overrides: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """DEMO_CONFIG's sections (copies) under `overrides`: a preset (``algorithm.preset``) replaces the demo's
    algorithm settings, as `grpo demo --algorithm.preset NAME` does (explicit keys still win)."""
    base = {k: dict(v) for k, v in DEMO_CONFIG.items()}
    if (overrides or {}).get("algorithm.preset"):
        base.pop("algorithm")
    return base


def start_demo(base: dict[str, Any], out_dir: str | Path, seed: int, steps: int | None,
               overrides: dict[str, Any] | None) -> tuple[Path, Config]:
    """What every demo does first: its output directory (made; a previous run's metrics.jsonl removed, so the
    curves are this run's only), its Config (`base` under `overrides`), the thread count and the seed."""
    out = demo_output_dir(out_dir, overrides)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    cfg = demo_config(base, out, seed, steps, overrides)
    if cfg.cpu.num_threads:
        torch.set_num_threads(cfg.cpu.num_threads)
    torch.manual_seed(seed)
    return out, cfg


def finish_demo(out: Path, results: dict[str, Any], cfg: Config, result: Any, start: float,
                eval_problems: int) -> dict[str, Any]:
    """What every demo does last: its summary (`results`, then the steps, wall times since `start`, held-out
    problems and checkpoint of the training `result`) in summary.json, the run's report (curves, alerts,
    samples, config), and a line naming the files written. Returns the summary."""
    from grpo.health.report import write_report

    summary = {**results, "steps": cfg.train.max_steps, "wall_s": round(time.perf_counter() - start, 1),
               "train_wall_s": round(result.wall_s, 1), "eval_problems": eval_problems,
               "checkpoint": str(result.checkpoint) if result.checkpoint else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    report = write_report([out])
    print(f"wrote {out / 'summary.json'}, {out / 'metrics.jsonl'}, {out / 'curves.png'}, {report}")
    return summary


def _table(before: dict[str, float], after: dict[str, float]) -> str:
    lines = [f"{'held-out metric':22s} {'before':>8s} {'after':>8s} {'change':>8s}"]
    for key in before:
        lines.append(f"{key:22s} {before[key]:8.3f} {after[key]:8.3f} {after[key] - before[key]:+8.3f}")
    return "\n".join(lines)


def run_demo(out_dir: str | Path = "runs/demo", *, steps: int | None = None, eval_problems: int = 256,
             seed: int = 0, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Before/after evaluation around a GRPO run; returns (and writes) the summary."""
    from grpo.training.evaluate import evaluate
    from grpo.modeling.models import EMBEDDED_MODEL_DIR, load_policy
    from grpo.rewards import load_reward
    from grpo.data.tasks.arithmetic import DEFAULT_REWARDS, generate
    from grpo.api.trainer import train

    start = time.perf_counter()
    out, cfg = start_demo(demo_settings(overrides), out_dir, seed, steps, overrides)
    metrics_path = out / "metrics.jsonl"
    model, tokenizer = load_policy(str(EMBEDDED_MODEL_DIR))
    held_out = generate("test", eval_problems, seed=seed)
    rewards = [load_reward(spec) for spec in DEFAULT_REWARDS]                # the task's own choice
    kw = dict(max_new_tokens=cfg.rollout.max_new_tokens)

    print(f"evaluating the base policy on {len(held_out)} held-out problems (greedy) ...", flush=True)
    before = evaluate(model, tokenizer, held_out, rewards, **kw)
    print(f"base policy: accuracy {before['accuracy']:.3f}; training GRPO for {cfg.train.max_steps} steps ...", flush=True)
    result = train(cfg, model, tokenizer)
    after = evaluate(result.model, tokenizer, held_out, rewards, **kw)
    print(_table(before, after))

    plot_curves(metrics_path, out / "curves.png")
    return finish_demo(out, {"before": before, "after": after}, cfg, result, start, len(held_out))
