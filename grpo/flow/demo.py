"""`grpo flow demo`: evaluate the base flow model on held-out prompts (reward and gold), run Flow-GRPO on
its training prompts (by default half of the prompts the base never saw; the held-out half is unseen by
both stages), evaluate again on the same noise; write DIR/summary.json, DIR/metrics.jsonl,
DIR/curves.png, DIR/grid.png (every held-out prompt, before | after) and DIR/grids/<prompt>.png."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.config import demo_config
from grpo.flow.evaluate import sample_images
from grpo.flow.loop import check_flow_config, load_model, run_flow
from grpo.flow.tasks import run_prompts
from grpo.health.figures import panel_grid
from grpo.state.metrics import read_metrics

# The demo's settings (every other key keeps its default; `grpo train --help-config` lists them).
DEMO_CONFIG: dict[str, dict[str, Any]] = {
    # the base names the colour in a quarter of its captions (grpo/assets/shapes-flow): it binds colour to the
    # 36 prompts it saw, not to new combinations. Flow-GRPO trains on half of the 12 unseen prompts and is
    # evaluated on the other half, unseen by both stages; the reward scores the main object only (extra blobs
    # do not pass), and `gold` (exactly one object) is reported beside it.
    "flow": {"reward": "compositional_main", "variant": "flow_grpo", "beta": 0.004, "prompts_per_step": 6,
             "updates_per_step": 2, "train_unseen_fraction": 0.5, "train_on_seen": False, "eval_samples": 16,
             "eval_every": 10},
    "rollout": {"num_generations": 8},
    "optim": {"lr": 5e-4, "warmup_steps": 3, "max_grad_norm": 1.0},
    # one thread: a 0.2M-parameter model gains nothing from a second one, and on a shared machine two thrash
    "train": {"max_steps": 80, "save_steps": 0},
    "cpu": {"num_threads": 1},
}
SHOWN_SAMPLES = 4                # images per prompt in the grids


def _table(before: dict[str, float], after: dict[str, float]) -> str:
    lines = [f"{'held-out metric':18s} {'before':>8s} {'after':>8s} {'change':>8s}"]
    lines += [f"{k:18s} {before[k]:8.3f} {after[k]:8.3f} {after[k] - before[k]:+8.3f}" for k in before]
    return "\n".join(lines)


def _tile(img: np.ndarray, scale: int = 6) -> np.ndarray:
    """uint8 [H, W, 3] -> enlarged with a 1-pixel grey frame."""
    framed = np.pad(img, ((1, 1), (1, 1), (0, 0)), constant_values=96)
    return framed.repeat(scale, 0).repeat(scale, 1)


def image_grid(rows: list[list[np.ndarray]], gap: int = 6) -> np.ndarray:
    """Rows of uint8 images -> one uint8 image (rows padded with black to the same width)."""
    lines = [np.concatenate([_tile(i) for i in row], axis=1) for row in rows]
    width = max(line.shape[1] for line in lines)
    lines = [np.pad(line, ((0, gap), (0, width - line.shape[1]), (0, 0))) for line in lines]
    return np.concatenate(lines, axis=0)


def write_grids(out: Path, prompts, before: torch.Tensor, after: torch.Tensor, per_prompt: int) -> Path:
    """grid.png (a row per held-out prompt: its reference render, before x k, after x k) and one PNG per prompt."""
    from PIL import Image

    from grpo.vision.shapes import render, to_uint8

    (out / "grids").mkdir(exist_ok=True)
    rows = []
    for i, p in enumerate(prompts):
        b = [to_uint8(before[i * per_prompt + k]) for k in range(min(SHOWN_SAMPLES, per_prompt))]
        a = [to_uint8(after[i * per_prompt + k]) for k in range(min(SHOWN_SAMPLES, per_prompt))]
        ref = render(p.scene, before.shape[-1])
        blank = np.zeros_like(ref)
        rows.append([ref, *b, blank, *a])
        Image.fromarray(image_grid([[ref, *b], [blank, *a]])).save(out / "grids" / f"{p.text.replace(' ', '_')}.png")
    Image.fromarray(image_grid(rows)).save(out / "grid.png")
    return out / "grid.png"


def plot_flow_curves(metrics_path: Path, out_png: Path) -> Path:
    panels = (("reward/total/mean", "training reward"), ("eval/compositional_main", "held-out compositional (main object)"),
              ("kl/mean", "KL to reference"), ("flow/diversity", "diversity (std within a group)"))
    return panel_grid(read_metrics(metrics_path), panels, out_png)


def run_flow_demo(out_dir: str | Path = "runs/flow-demo", *, steps: int | None = None, seed: int = 0,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Before/after evaluation around a Flow-GRPO run; returns (and writes) the summary."""
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)              # the demo's metrics are this run's only
    cfg = demo_config(DEMO_CONFIG, out, seed, steps, overrides)
    if cfg.cpu.num_threads:
        torch.set_num_threads(cfg.cpu.num_threads)
    task = check_flow_config(cfg)
    model = load_model(cfg, task, torch.device("cpu"))
    trained_on, held_out = run_prompts(task, cfg.flow)
    n = cfg.flow.eval_samples
    print(f"evaluating the base model on {len(held_out)} held-out prompts x {n} images ...", flush=True)
    images_before, rows = sample_images(model, task, held_out, cfg, n, seed=seed + 12345)
    before = {k: float(fn(images_before, rows).mean()) for k, fn in task.metrics.items()}
    print(f"base: compositional_main {before['compositional_main']:.3f}, gold {before['gold']:.3f}; Flow-GRPO for "
          f"{cfg.train.max_steps} steps ...", flush=True)
    result = run_flow(cfg, model)
    images_after, _ = sample_images(result.model, task, held_out, cfg, n, seed=seed + 12345)
    after = {k: float(fn(images_after, rows).mean()) for k, fn in task.metrics.items()}
    print(_table(before, after))
    plot_flow_curves(out / "metrics.jsonl", out / "curves.png")
    grid = write_grids(out, held_out, images_before, images_after, n)
    summary = {"before": before, "after": after, "steps": result.steps, "held_out_prompts": [p.text for p in held_out],
               "training_prompts": [p.text for p in trained_on],
               "images_per_prompt": n, "wall_s": round(time.perf_counter() - start, 1),
               "train_wall_s": round(result.wall_s, 1), "checkpoint": str(result.checkpoint) if result.checkpoint else None,
               "config": {"train.seed": seed, "train.max_steps": cfg.train.max_steps, **(overrides or {})}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {out / 'summary.json'}, {out / 'metrics.jsonl'}, {out / 'curves.png'}, {grid} "
          f"({summary['wall_s']:.0f}s)")
    return summary
