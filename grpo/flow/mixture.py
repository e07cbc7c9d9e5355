"""A 2-D Gaussian mixture and its exact rectified-flow velocity, for testing the samplers.

Data x0 ~ sum_k w_k N(m_k, s_k^2 I), noise eps ~ N(0, I), x_t = (1 - t) x0 + t eps. Given component k,
(x0, eps, x_t) are jointly Gaussian with V_k = (1 - t)^2 s_k^2 + t^2, so

    E[x0 | x_t, k]  = m_k + (1 - t) s_k^2 / V_k (x_t - (1 - t) m_k)
    E[eps | x_t, k] = t / V_k (x_t - (1 - t) m_k)
    v(x_t, t)       = sum_k gamma_k(x_t) (E[eps | x_t, k] - E[x0 | x_t, k]),
    gamma_k(x_t)    ∝ w_k N(x_t; (1 - t) m_k, V_k I)

the velocity whose ODE carries N(0, I) at t = 1 exactly onto the mixture at t = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Mixture:
    means: torch.Tensor      # [K, 2]
    stds: torch.Tensor       # [K]
    weights: torch.Tensor    # [K], summing to 1


def default_mixture(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Mixture:
    """Four well-separated components on a square with unequal weights."""
    means = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]], dtype=dtype, device=device)
    stds = torch.tensor([0.3, 0.4, 0.3, 0.5], dtype=dtype, device=device)
    weights = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=dtype, device=device)
    return Mixture(means, stds, weights)


def mixture_velocity(mix: Mixture, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The exact velocity E[eps - x0 | x_t = x] (module docstring).   Shape: x [N, 2], t [N] -> [N, 2]"""
    t = t.to(x.dtype)[:, None, None]                                      # [N, 1, 1]
    m, s2 = mix.means[None], (mix.stds ** 2)[None, :, None]               # [1, K, 2], [1, K, 1]
    var = (1 - t) ** 2 * s2 + t ** 2                                      # [N, K, 1]
    resid = x[:, None, :] - (1 - t) * m                                   # [N, K, 2]
    log_w = torch.log(mix.weights)[None] - (resid ** 2).sum(-1) / (2 * var[..., 0]) - torch.log(var[..., 0])
    gamma = torch.softmax(log_w, dim=1)[..., None]                        # [N, K, 1] (2-D: det = var^2)
    v_k = t / var * resid - (m + (1 - t) * s2 / var * resid)              # E[eps|k] - E[x0|k]
    return (gamma * v_k).sum(1)


def sample_mixture(mix: Mixture, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n points of the mixture and their component.   -> ([n, 2], [n] long)"""
    dev = mix.means.device
    k = torch.multinomial(mix.weights, n, replacement=True, generator=generator)
    z = torch.randn(n, 2, generator=generator, device=dev, dtype=mix.means.dtype)
    return mix.means[k] + mix.stds[k, None] * z, k


def nearest_component(mix: Mixture, x: torch.Tensor) -> torch.Tensor:
    """The component whose mean is closest to each point.   Shape: [N, 2] -> [N] long"""
    return torch.cdist(x, mix.means.to(x.dtype)).argmin(dim=1)
