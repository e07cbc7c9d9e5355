"""`grpo demo --task calculator`: GRPO teaches a tiny model to use a calculator tool (docs/agents.md).

Evaluates the cold-start policy on held-out problems with the calculator and without it (every call
answered "error: tools are disabled": the no-tool policy), runs GRPO with multi-turn episodes, evaluates
both ways again. Writes DIR/summary.json, DIR/metrics.jsonl, DIR/curves.png and DIR/report.html.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from grpo.cli.demo import finish_demo, start_demo
from grpo.cli.plots import plot_curves
from grpo.envs import ToolEnv

CALCULATOR_CONFIG: dict[str, dict[str, Any]] = {
    "data": {"task": "calculator"},
    "rollout": {"num_generations": 8, "max_new_tokens": 48, "temperature": 1.0, "env": "calculator",
                "tool_parser": "call", "max_turns": 2},
    "algorithm": {"beta": 0.04, "epsilon": 0.2},
    "optim": {"lr": 1e-4, "warmup_steps": 5, "max_grad_norm": 1.0},
    "train": {"prompts_per_step": 16, "max_steps": 100},
    "cpu": {"num_threads": 1},
}


class NoToolsEnv(ToolEnv):
    """The calculator taken away: every tool call is answered with an error."""

    def step(self, action):
        if isinstance(action, str):
            return "", True, {}
        return "error: tools are disabled", False, {"error": True}


def _table(rows: dict[str, dict[str, float]]) -> str:
    cols = ("exact_match", "tool_use", "episode_length")
    lines = [f"{'held-out (greedy)':34s} " + " ".join(f"{c:>15s}" for c in cols)]
    for name, v in rows.items():
        lines.append(f"{name:34s} " + " ".join(f"{v[c]:15.3f}" for c in cols))
    return "\n".join(lines)


#: The calculator demo's curves (grpo.cli.plots.plot_curves panels).
AGENT_PANELS = (("reward/exact_match/mean", "accuracy (training episodes)"),
                ("tools/use_rate", "episodes calling the tool"),
                ("completion/length_mean", "episode length (tokens)"), ("kl/mean", "KL to reference"))


def run_calculator_demo(out_dir: str | Path = "runs/demo-calculator", *, steps: int | None = None,
                        eval_problems: int = 256, seed: int = 0, overrides: dict[str, Any] | None = None) -> dict:
    """Before/after evaluation (with and without the tool) around a multi-turn GRPO run; returns the summary."""
    from grpo.api.trainer import Trainer
    from grpo.data.tasks import calculator
    from grpo.envs import load_env
    from grpo.modeling.models import CALCULATOR_MODEL_DIR, load_policy
    from grpo.rewards import load_reward
    from grpo.training.episode_eval import evaluate_episodes

    start = time.perf_counter()
    out, cfg = start_demo(CALCULATOR_CONFIG, out_dir, seed, steps, overrides)
    model, tokenizer = load_policy(str(CALCULATOR_MODEL_DIR))
    held_out = calculator.generate("test", eval_problems, seed=seed)
    rewards = [load_reward(spec) for spec in calculator.DEFAULT_REWARDS]
    tools = load_env(cfg.rollout.env, cfg.rollout.tool_timeout_s, cfg.rollout.max_observation_chars)
    no_tools = load_env(NoToolsEnv)

    def measure(m) -> tuple[dict, dict]:
        return (evaluate_episodes(m, tokenizer, held_out, rewards, tools, cfg),
                evaluate_episodes(m, tokenizer, held_out, rewards, no_tools, cfg))

    print(f"evaluating the cold-start policy on {len(held_out)} held-out problems (greedy) ...", flush=True)
    before, before_no_tools = measure(model)
    print(f"cold start: accuracy {before['exact_match']:.3f} with the calculator, {before_no_tools['exact_match']:.3f} "
          f"without; training GRPO for {cfg.train.max_steps} steps ...", flush=True)
    result = Trainer(model, tokenizer=tokenizer, config=cfg).train()
    after, after_no_tools = measure(result.model)
    rows = {"cold start, calculator": before, "cold start, no tool": before_no_tools,
            "after GRPO, calculator": after, "after GRPO, no tool": after_no_tools}
    print(_table(rows))
    plot_curves(out / "metrics.jsonl", out / "curves.png", panels=AGENT_PANELS)
    return finish_demo(out, {"before": before, "before_no_tools": before_no_tools, "after": after,
                              "after_no_tools": after_no_tools}, cfg, result, start, len(held_out))
