"""diffusers SD3-style models in our sampler (optional: diffusers is not a dependency of grpo).

diffusers' FlowMatchEulerDiscreteScheduler uses our convention: its sigma is our t (x_sigma = (1 - sigma) x0
+ sigma eps, the transformer predicts eps - x0, `step` is x + (sigma_next - sigma) v, our ODE step with
h = sigma - sigma_next). So a pipeline's transformer is a velocity field once its inputs are mapped:

    v(x, t, labels) = transformer(hidden_states=x, timestep=1000 t,
                                  encoder_hidden_states=E[labels], pooled_projections=P[labels]).sample

with E / P the prompt embeddings of a fixed prompt set computed once by the pipeline's text encoders
(`encode_prompt`), row i for prompt i and the last row for the negative prompt (CFG's null label). The
time grid is the scheduler's sigmas (:func:`scheduler_times`), shift included, so the same
`ode_sample` / `sde_sample` / `step_logprob` run on it; training follows as for our own models.

Not supported: schedulers other than FlowMatchEulerDiscreteScheduler (the SDE formulas assume
rectified flow), dynamic (resolution-dependent) shifting computed inside a pipeline's __call__ (pass
the shifted sigmas yourself), VAE decoding inside the loop (rewards receive latents; decode in the reward),
peft LoRA on the transformer as the KL reference (the loop keeps a frozen copy), and text-encoder training.
"""

from __future__ import annotations

import torch
from torch import nn


class DiffusersVelocity(nn.Module):
    """A diffusers SD3-style transformer as `velocity(x, t, labels)`; labels [N, 1] index the prompt table."""

    def __init__(self, transformer: nn.Module, prompt_embeds: torch.Tensor, pooled_embeds: torch.Tensor):
        super().__init__()
        self.transformer = transformer
        self.register_buffer("prompt_embeds", prompt_embeds, persistent=False)     # [P + 1, L, D]
        self.register_buffer("pooled_embeds", pooled_embeds, persistent=False)     # [P + 1, D_pool]
        self.cond = type("Vocab", (), {"vocab": [prompt_embeds.shape[0] - 1]})()   # the last row: negative prompt

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        """The negative prompt's row for every sample.   [N, 1] -> [N, 1]"""
        return torch.full_like(cond, self.prompt_embeds.shape[0] - 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        idx = cond[:, 0]
        out = self.transformer(hidden_states=x, timestep=t * 1000.0, encoder_hidden_states=self.prompt_embeds[idx],
                               pooled_projections=self.pooled_embeds[idx], return_dict=False)[0]
        return out


def scheduler_times(scheduler, num_steps: int, device: torch.device) -> torch.Tensor:
    """Our time grid [S + 1] from a FlowMatchEulerDiscreteScheduler: its sigmas after set_timesteps (the
    terminal 0 included)."""
    if type(scheduler).__name__ != "FlowMatchEulerDiscreteScheduler":
        raise ValueError(f"scheduler_times: only FlowMatchEulerDiscreteScheduler is supported, got "
                         f"{type(scheduler).__name__}")
    scheduler.set_timesteps(num_steps, device=device)
    return scheduler.sigmas.to(device=device, dtype=torch.float32)
