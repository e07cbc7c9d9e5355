"""Learnable parts of the loss that live beside the policy (lambda-GRPO's lambda): each is a parameter
group of the policy's optimizer (its own learning rate, no weight decay), a file of every checkpoint and
metrics every step, through the loop's extras protocol (after_step / save / load, grpo.types.TrainState).

Single process only: under torchrun these parameters are outside DDP / FSDP2, so their gradients would
not be averaged over ranks; :func:`build_learnable_losses` refuses to run there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from grpo.algorithms.token_preference import TokenPreference
from grpo.config import Config


class LearnableLoss:
    """One learnable loss module, checkpointed as `<name>.pt`; `lr` is its optimizer group's learning rate."""

    def __init__(self, name: str, module: torch.nn.Module, lr: float):
        self.name, self.module, self.lr = name, module, lr

    def param_group(self) -> dict[str, Any]:
        """Its optimizer group; `grpo_lr` keeps its own base rate through a resume (grpo.state.resume_config)."""
        return {"params": list(self.module.parameters()), "lr": self.lr, "grpo_lr": self.lr, "weight_decay": 0.0}

    def after_step(self, step: int, exp) -> dict[str, float]:
        return self.module.metrics()

    def save(self, directory: Path) -> None:
        torch.save(self.module.state_dict(), Path(directory) / f"{self.name}.pt")

    def load(self, directory: Path) -> None:
        """In place: the optimizer keeps referring to the same parameters."""
        self.module.load_state_dict(torch.load(Path(directory) / f"{self.name}.pt", weights_only=True))


def build_learnable_losses(cfg: Config, model: torch.nn.Module) -> list[LearnableLoss]:
    """The run's learnable loss modules, on the policy's device (`algorithm.token_preference`)."""
    algo, device = cfg.algorithm, next(model.parameters()).device
    if algo.token_preference != "none" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("algorithm.token_preference runs in a single process only (its lambda is outside DDP / FSDP2)")
    found = []
    if algo.token_preference == "lambda":
        found.append(LearnableLoss("token_preference", TokenPreference(algo.lambda_init, algo.lambda_r,
                                                                       cfg.rollout.num_generations, device),
                                   algo.lambda_lr))
    return found


def token_preference_of(extras: list) -> TokenPreference | None:
    """The lambda-GRPO module among the loop's extras, if any."""
    return next((x.module for x in extras if isinstance(x, LearnableLoss) and isinstance(x.module, TokenPreference)),
                None)
