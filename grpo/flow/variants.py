"""Flow-GRPO's options as registry entries chosen by `flow.variant` (no if/elif over variants).

A variant fixes four things:

* ``sigma``: the noise schedule (grpo.flow.sde.SIGMA_SCHEDULES): Flow-GRPO's a sqrt(t / (1 - t)) or
  DanceGRPO's constant a;
* ``share_noise``: whether the G samples of a group start from the same initial noise (DanceGRPO);
* ``plan``: which of the S sampler steps are stochastic (SDE) and which of those are trained, for a
  given training step (a :class:`StepPlan`);
* ``kl``: whether the variant may carry the KL term (DanceGRPO trains without it).

Plans (pure functions of the step count, the training step and a generator):

* ``all_but_last`` (Flow-GRPO): SDE on steps 0 .. S-2, all trained; the final step, whose sigma would
  be tiny, is an ODE step and not trained (the image comes out clean);
* ``random_window`` (Flow-GRPO-Fast): a window of `window_size` SDE steps at a random place among the
  first half of the steps, ODE elsewhere; only the window is trained;
* ``sliding_window`` (MixGRPO): the window starts at step 0 and moves one step towards low noise every
  `window_shift_every` training steps, until it reaches the last trainable step;
* ``random_subset`` (DanceGRPO): SDE on steps 0 .. S-2, a random `train_fraction` of them trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class StepPlan:
    sde: torch.Tensor      # [S] bool: the step is a stochastic (Euler-Maruyama) step with a log-prob
    train: torch.Tensor    # [S] bool: the step enters the loss (a subset of sde)


@dataclass(frozen=True)
class PlanArgs:
    num_steps: int         # S sampler steps
    train_step: int        # the training step (1-based), for sliding windows
    window_size: int
    window_shift_every: int
    train_fraction: float


def _mask(num_steps: int, idx: torch.Tensor) -> torch.Tensor:
    m = torch.zeros(num_steps, dtype=torch.bool, device=idx.device)
    m[idx] = True
    return m


def plan_all_but_last(p: PlanArgs, g: torch.Generator) -> StepPlan:
    """Steps 0 .. S-2 stochastic and trained, the last one deterministic."""
    sde = _mask(p.num_steps, torch.arange(p.num_steps - 1, device=g.device))
    return StepPlan(sde, sde.clone())


def plan_random_window(p: PlanArgs, g: torch.Generator) -> StepPlan:
    """A window of `window_size` steps starting at a random step among the first half (Flow-GRPO-Fast)."""
    w = min(p.window_size, p.num_steps - 1)
    last_start = max(0, min((p.num_steps - 1) // 2, p.num_steps - 1 - w))
    start = int(torch.randint(0, last_start + 1, (1,), generator=g, device=g.device))
    sde = _mask(p.num_steps, torch.arange(start, start + w, device=g.device))
    return StepPlan(sde, sde.clone())


def plan_sliding_window(p: PlanArgs, g: torch.Generator) -> StepPlan:
    """MixGRPO's window: starts at step (train_step - 1) // window_shift_every, high noise to low, and stops
    at the last trainable step."""
    w = min(p.window_size, p.num_steps - 1)
    start = min((p.train_step - 1) // max(1, p.window_shift_every), p.num_steps - 1 - w)
    sde = _mask(p.num_steps, torch.arange(start, start + w, device=g.device))
    return StepPlan(sde, sde.clone())


def plan_random_subset(p: PlanArgs, g: torch.Generator) -> StepPlan:
    """SDE on steps 0 .. S-2; a random ceil(train_fraction (S - 1)) of them trained (DanceGRPO)."""
    n = p.num_steps - 1
    k = max(1, min(n, int(-(-p.train_fraction * n // 1))))
    chosen = torch.randperm(n, generator=g, device=g.device)[:k]
    sde = _mask(p.num_steps, torch.arange(n, device=g.device))
    return StepPlan(sde, _mask(p.num_steps, chosen))


@dataclass(frozen=True)
class Variant:
    sigma: str                                        # grpo.flow.sde.SIGMA_SCHEDULES key
    share_noise: bool                                 # one initial noise per group
    plan: Callable[[PlanArgs, torch.Generator], StepPlan]
    kl: bool                                          # may use flow.beta > 0


VARIANTS: dict[str, Variant] = {
    "flow_grpo": Variant("flow", False, plan_all_but_last, True),
    "flow_grpo_fast": Variant("flow", False, plan_random_window, True),
    "mix_grpo": Variant("flow", False, plan_sliding_window, True),
    "dance_grpo": Variant("constant", True, plan_random_subset, False),
}
