"""Learnable parts of the loss that live beside the policy (lambda-GRPO's lambda): each is a parameter
group of the policy's optimizer (its own learning rate, no weight decay), a file of every checkpoint and
metrics every step, through the loop's extras protocol (after_step / save / load, grpo.types.TrainState).
The adaptive entropy coefficient (:class:`EntropyControl`) rides the same protocol without parameters.

Single process only: under torchrun these parameters are outside DDP / FSDP2, so their gradients would
not be averaged over ranks; :func:`build_learnable_losses` refuses to run there.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from grpo.algorithms.entropy_control import ENTROPY_CONTROLS, EntropyControlParams
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
        saved = torch.load(Path(directory) / f"{self.name}.pt", weights_only=True, map_location="cpu")
        self.module.load_state_dict(saved)


def build_learnable_losses(cfg: Config, model: torch.nn.Module) -> list[LearnableLoss]:
    """The run's learnable loss modules, on the policy's device (`algorithm.token_preference`)."""
    algo, device = cfg.algorithm, next(model.parameters()).device
    if algo.token_preference.name != "none" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("algorithm.token_preference runs in a single process only (its lambda is outside DDP / FSDP2)")
    found = []
    if algo.token_preference.name == "lambda":
        p = algo.token_preference.params                                   # LambdaParams: init, r, lr
        found.append(LearnableLoss("token_preference", TokenPreference(p.init, p.r, cfg.rollout.num_generations,
                                                                       device), p.lr))
    return found


def token_preference_of(extras: list) -> TokenPreference | None:
    """The lambda-GRPO module among the loop's extras, if any."""
    return next((x.module for x in extras if isinstance(x, LearnableLoss) and isinstance(x.module, TokenPreference)),
                None)


class EntropyControl:
    """The entropy bonus coefficient of a run (``algorithm.entropy_control``), checkpointed as
    ``entropy_control.json`` so a resumed run continues the same sequence of coefficients."""

    FILE = "entropy_control.json"

    def __init__(self, mode: str, coef: float, params: EntropyControlParams):
        self.mode, self.coef, self.params = mode, coef, params
        self.last_entropy = math.inf        # no measurement yet: the adaptive bonus starts off
        self.applied_coef = 0.0

    def applied(self) -> float:
        """The coefficient this optimizer step applies."""
        self.applied_coef = ENTROPY_CONTROLS[self.mode][0](self.coef, self.last_entropy, self.params)
        return self.applied_coef

    def observe(self, entropy: float) -> None:
        """After an optimizer step: its mean token entropy moves the coefficient for the next one."""
        if math.isfinite(entropy):
            self.coef = ENTROPY_CONTROLS[self.mode][1](self.coef, entropy, self.params)
            self.last_entropy = entropy

    def after_step(self, step: int, exp) -> dict[str, float]:
        return {"entropy/coef": self.coef, "entropy/coef_applied": self.applied_coef}

    def save(self, directory: Path) -> None:
        state = {"coef": self.coef, "applied": self.applied_coef,
                 "last_entropy": self.last_entropy if math.isfinite(self.last_entropy) else None}
        (Path(directory) / self.FILE).write_text(json.dumps(state))

    def load(self, directory: Path) -> None:
        state = json.loads((Path(directory) / self.FILE).read_text())
        self.coef, self.applied_coef = float(state["coef"]), float(state["applied"])
        self.last_entropy = math.inf if state["last_entropy"] is None else float(state["last_entropy"])


def build_entropy_control(cfg: Config) -> list[EntropyControl]:
    """The run's entropy coefficient controller when it changes over the run (``entropy_control`` adaptive)."""
    algo = cfg.algorithm
    if algo.entropy_control.name == "fixed":
        return []
    return [EntropyControl(algo.entropy_control.name, algo.entropy_coef, algo.entropy_control.params)]


def entropy_control_of(extras: list) -> EntropyControl | None:
    """The entropy coefficient controller among the loop's extras, if any."""
    return next((x for x in extras if isinstance(x, EntropyControl)), None)

