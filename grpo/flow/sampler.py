"""The samplers: a thin loop over the time grid; every formula is in grpo/flow/sde.py.

`velocity(x [N, ...], t [N], cond) -> v [N, ...]` is any conditional velocity field: a model of
grpo/flow/models.py (through :func:`guided` for classifier-free guidance), the analytic field of the
2-D mixture (grpo/flow/mixture.py) or a diffusers transformer (grpo/flow/diffusers_adapter.py).

* :func:`ode_sample`: the deterministic sampler for evaluation (flow.eval_steps, ~40 steps);
* :func:`sde_sample`: the training sampler (flow.train_steps, ~10 steps) that follows a
  :class:`grpo.flow.variants.StepPlan` (SDE or ODE per step) and stores the whole trajectory and the
  log-prob of every SDE transition, computed by :func:`step_logprob`, the function the update also uses,
  so the ratio at the sampling parameters is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from grpo.flow.sde import cfg_velocity, gaussian_logprob, ode_step, sde_mean, sde_sample as em_sample, sde_std

Velocity = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Trajectory:
    states: torch.Tensor      # [N, S + 1, ...] x at t_0 = 1 (the initial noise) .. t_S = 0 (the sample)
    logprobs: torch.Tensor    # [N, S] float32 log pi(x_{j+1} | x_j) of SDE steps (0 on ODE steps)
    times: torch.Tensor       # [S + 1]
    sigmas: torch.Tensor      # [S] sigma_{t_j} of SDE steps, 0 on ODE steps
    sde: torch.Tensor         # [S] bool
    train: torch.Tensor       # [S] bool, the steps the loss uses
    cond: torch.Tensor        # [N, K] the conditioning labels

    @property
    def samples(self) -> torch.Tensor:
        """The final images / points x_{t_S}.  [N, ...]"""
        return self.states[:, -1]


def guided(model: torch.nn.Module, scale: float) -> Velocity:
    """The model's velocity with classifier-free guidance of scale w (w = 1: one conditional forward).
    The unconditional forward uses the model's null labels (`model.null_cond`)."""
    if scale == 1.0:
        return model

    def velocity(x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        null = model.null_cond(cond)                                         # [N, K]
        both = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([cond, null]))   # one batched forward
        v_cond, v_uncond = both.chunk(2)
        return cfg_velocity(v_cond, v_uncond, scale)
    return velocity


def ode_sample(velocity: Velocity, x: torch.Tensor, cond: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """Euler ODE from t = 1 (x, the noise) to t = 0.   Shape: x [N, ...] -> [N, ...]"""
    n = x.shape[0]
    for j in range(times.numel() - 1):
        t, h = times[j], times[j] - times[j + 1]
        x = ode_step(x, velocity(x, t.expand(n), cond), h)
    return x


def step_logprob(velocity: Velocity, x: torch.Tensor, x_next: torch.Tensor, t: torch.Tensor, h: torch.Tensor,
                 sigma: torch.Tensor, cond: torch.Tensor, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_theta(x_next | x) of one Euler-Maruyama transition per row, and its mean mu_theta.

    Shape: x, x_next [M, ...]; t, h, sigma, cond rows [M] / [M, K] -> (logp [M] float32, mu [M, ...])
    """
    mu = sde_mean(x, velocity(x, t, cond), t, h, sigma)
    return gaussian_logprob(x_next, mu, sde_std(sigma, h), reduction), mu


def sde_sample(velocity: Velocity, x: torch.Tensor, cond: torch.Tensor, times: torch.Tensor, sigmas: torch.Tensor,
               sde: torch.Tensor, train: torch.Tensor, noise: torch.Tensor, reduction: str = "mean") -> Trajectory:
    """Sample S steps, SDE where `sde` says (x_{j+1} = mu + sigma_t sqrt(h) z_j), Euler ODE elsewhere.

    `noise` [S, N, ...] holds the z_j (drawn by the caller from its keyed generator); `sigmas` [S] are
    sigma_{t_j} (ignored on ODE steps). With sigma = 0 everywhere this is exactly :func:`ode_sample`.

    Shape: x [N, ...] -> Trajectory (states [N, S + 1, ...], logprobs [N, S])
    """
    n, steps = x.shape[0], times.numel() - 1
    states, logps = [x], []
    zero = torch.zeros(n, dtype=torch.float32, device=x.device)
    for j in range(steps):
        t, h = times[j].expand(n), (times[j] - times[j + 1]).expand(n)     # [N] per row, as in the update
        v = velocity(x, t, cond)
        if bool(sde[j]):
            s = sigmas[j].expand(n)
            mu = sde_mean(x, v, t, h, s)
            x_next = em_sample(mu, sde_std(s, h), noise[j])
            logps.append(gaussian_logprob(x_next, mu, sde_std(s, h), reduction) if bool(sigmas[j] > 0) else zero)
        else:
            x_next = ode_step(x, v, h)
            logps.append(zero)
        states.append(x_next)
        x = x_next
    return Trajectory(torch.stack(states, 1), torch.stack(logps, 1), times, torch.where(sde, sigmas, 0), sde,
                      train, cond)
