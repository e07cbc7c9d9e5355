"""Evaluation of a flow model on prompts: ODE sampling with flow.eval_steps steps and the task's metrics
(reward, compositional, gold, ...), each averaged over flow.eval_samples images per prompt. The initial
noise is keyed by train.seed, so before and after are compared on the same noise."""

from __future__ import annotations

import torch

from grpo.flow.sampler import guided, ode_sample
from grpo.flow.sde import time_grid
from grpo.flow.tasks import FlowTask, Prompt, labels_tensor


@torch.no_grad()
def sample_images(model: torch.nn.Module, task: FlowTask, prompts: list[Prompt], cfg, samples: int,
                  seed: int) -> tuple[torch.Tensor, list[Prompt]]:
    """`samples` ODE samples per prompt, from noise keyed by `seed`.   -> ([P samples, ...], rows)"""
    fc = cfg.flow
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(samples)]
    g = torch.Generator(device=device).manual_seed(seed)
    x1 = torch.randn(len(rows), *task.data_shape(fc), generator=g, device=device)
    times = time_grid(fc.eval_steps, device, fc.time_shift)
    return ode_sample(guided(model, fc.guidance_scale), x1, labels_tensor(rows, device), times), rows


def evaluate(model: torch.nn.Module, task: FlowTask, prompts: list[Prompt], cfg, seed: int = 12345) -> dict[str, float]:
    """The mean of each task metric over the prompts' ODE samples."""
    images, rows = sample_images(model, task, prompts, cfg, cfg.flow.eval_samples, seed)
    return {name: float(fn(images, rows).mean()) for name, fn in task.metrics.items()}
