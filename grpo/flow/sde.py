"""The math of Flow-GRPO's sampler (Liu et al., arXiv 2505.05470, section 4.1): small pure functions.

Convention (rectified flow): x_t = (1 - t) x0 + t eps, t = 1 is noise, t = 0 is data; the model predicts
the velocity v ~ eps - x0 and the ODE dx = v dt runs from t = 1 to t = 0. With the score of rectified
flow, grad log p_t(x) = -(x + (1 - t) v) / t, the SDE

    dx = [v + sigma_t^2 / (2 t) (x + (1 - t) v)] dt + sigma_t dw,      sigma_t = a sqrt(t / (1 - t))

has the ODE's marginals for any sigma_t (a = flow.noise_level). One Euler-Maruyama step t -> t - h:

    mu_theta    = x_t - h [v_theta + sigma_t^2 / (2 t) (x_t + (1 - t) v_theta)]
    x_{t - h}   = mu_theta + sigma_t sqrt(h) z,                 z ~ N(0, I)
    log pi      = log N(x_{t - h}; mu_theta, sigma_t^2 h I)     (fp32; mean or sum over dimensions)
    KL(pi_theta || pi_ref) = ||mu_theta - mu_ref||^2 / (2 sigma_t^2 h)  (same covariance; same reduction)

Every function takes tensors whose first dim is the batch N; `D` below is the flattened rest.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


def time_grid(num_steps: int, device: torch.device, shift: float = 1.0) -> torch.Tensor:
    """The sampler's times t_0 = 1 > t_1 > ... > t_S = 0, uniform, optionally shifted as in SD3:
    t' = shift t / (1 + (shift - 1) t) (shift > 1 spends more steps at high noise).

    Shape: -> [S + 1] float32 on `device`
    """
    if num_steps < 1:
        raise ValueError(f"time_grid: num_steps must be >= 1, got {num_steps}")
    t = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32, device=device)
    return shift * t / (1 + (shift - 1) * t)


def flow_sigma(t: torch.Tensor, a: float, t_max: float) -> torch.Tensor:
    """Flow-GRPO's noise schedule sigma_t = a sqrt(t / (1 - t)), with t clamped to `t_max` < 1 in the
    denominator (the t = 1 endpoint, where sigma is infinite; Flow-GRPO uses the grid's second time).

    Shape: t [] or [N] -> same
    """
    return a * torch.sqrt(t / (1 - torch.clamp(t, max=t_max)))


def constant_sigma(t: torch.Tensor, a: float, t_max: float) -> torch.Tensor:
    """DanceGRPO's schedule: sigma_t = a at every t (the drift correction keeps the marginals).  Shape: same as t."""
    return torch.full_like(t, a)


#: flow.variant's noise schedule (chosen by the variant registry, grpo/flow/variants.py)
SIGMA_SCHEDULES: dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]] = {
    "flow": flow_sigma, "constant": constant_sigma,
}


def _b(x: torch.Tensor, s: torch.Tensor | float) -> torch.Tensor | float:
    """A scalar or per-row [N] value broadcast against x [N, ...]."""
    if isinstance(s, torch.Tensor) and s.dim() == 1:
        return s.view(-1, *([1] * (x.dim() - 1)))
    return s


def ode_step(x: torch.Tensor, v: torch.Tensor, h: torch.Tensor | float) -> torch.Tensor:
    """Euler step of dx = v dt from t to t - h:  x_{t-h} = x_t - h v.   Shape: x, v [N, ...] -> [N, ...]."""
    return x - _b(x, h) * v


def sde_mean(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor | float, h: torch.Tensor | float,
             sigma: torch.Tensor | float) -> torch.Tensor:
    """The Euler-Maruyama mean mu = x_t - h [v + sigma_t^2 / (2 t) (x_t + (1 - t) v)].

    With sigma = 0 this is exactly :func:`ode_step` (the correction is 0, x - h (v + 0) = x - h v).
    t, h, sigma: scalars or per-row [N] (t > 0).   Shape: x, v [N, ...] -> [N, ...]
    """
    t, h, sigma = _b(x, t), _b(x, h), _b(x, sigma)
    return x - h * (v + sigma ** 2 / (2 * t) * (x + (1 - t) * v))


def sde_std(sigma: torch.Tensor | float, h: torch.Tensor | float) -> torch.Tensor | float:
    """The step's standard deviation sigma_t sqrt(h).   Shape: scalars or [N] -> same."""
    return sigma * (h ** 0.5)


def sde_sample(mean: torch.Tensor, std: torch.Tensor | float, z: torch.Tensor) -> torch.Tensor:
    """x_{t-h} = mu + sigma_t sqrt(h) z.   Shape: mean, z [N, ...]; std scalar or [N] -> [N, ...]."""
    return mean + _b(mean, std) * z


def _reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    flat = values.flatten(1)                                    # [N, D]
    if reduction == "mean":
        return flat.mean(dim=1)
    if reduction == "sum":
        return flat.sum(dim=1)
    raise ValueError(f"flow.logprob_reduction must be mean or sum, got {reduction!r}")


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor | float,
                     reduction: str = "mean") -> torch.Tensor:
    """log N(x; mean, std^2 I) in float32, reduced over dimensions by `mean` (per-dimension average,
    Flow-GRPO's choice: the clip range then does not depend on the image size) or `sum` (the exact
    log-density):  -(x - mean)^2 / (2 std^2) - log std - log sqrt(2 pi)  per dimension.

    Shape: x, mean [N, ...]; std scalar or [N] -> [N] float32
    """
    x, mean = x.float(), mean.float()
    std = std.float() if isinstance(std, torch.Tensor) else torch.tensor(float(std), device=x.device)
    s = _b(x, std) if std.dim() == 1 else std
    per_dim = -((x - mean) ** 2) / (2 * s ** 2) - torch.log(s) - 0.5 * math.log(2 * math.pi)
    return _reduce(per_dim, reduction)


def gaussian_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor | float,
                reduction: str = "mean") -> torch.Tensor:
    """KL between N(mean, std^2 I) and N(ref_mean, std^2 I): ||mean - ref_mean||^2 / (2 std^2), with
    std^2 = sigma_t^2 h; reduced like :func:`gaussian_logprob` (`mean`: divided by the dimension D).

    Shape: mean, ref_mean [N, ...]; std scalar or [N] -> [N] float32
    """
    mean, ref_mean = mean.float(), ref_mean.float()
    std = std.float() if isinstance(std, torch.Tensor) else torch.tensor(float(std), device=mean.device)
    s = _b(mean, std) if std.dim() == 1 else std
    return _reduce((mean - ref_mean) ** 2 / (2 * s ** 2), reduction)


def cfg_velocity(v_cond: torch.Tensor, v_uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance: v = v_uncond + w (v_cond - v_uncond) (w = 1: the conditional velocity).

    Shape: [N, ...] x2 -> [N, ...]
    """
    return v_uncond + scale * (v_cond - v_uncond)
