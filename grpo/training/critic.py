"""Hybrid GRPO's critic (`algorithm.critic: value_head`; the math in grpo/algorithms/hybrid.py).

A value head on the policy: V(q) = w . sg[h(q)] + b, with h(q) the policy's last hidden state at the
last prompt token, from one no-grad forward over the B prompts of the step (not the B * G completions).
The trunk is shared and detached: the value loss trains the head only, with its own AdamW
(`algorithm.critic.lr`, `algorithm.critic.steps` full-batch steps after every RL step), so the policy's
update is untouched. The head and its optimizer are one checkpoint file (`value_head.pt`) through the
loop's extras protocol (after_step / save / load), so a resume continues it exactly. Single process only.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from grpo.algorithms.hybrid import ValueHead, hybrid_advantages, value_loss
from grpo.config import Config


def prompt_features(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """The policy's last hidden state at the last prompt token (prompts are left-padded), detached.

    Shape: [B, P] x2 -> [B, H] float32
    """
    positions = (prompt_mask.long().cumsum(dim=1) - 1).clamp(min=0)                 # left padding: start at 0
    with torch.no_grad():
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                    output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1][:, -1].float()                                      # [B, H]


class PromptCritic:
    """The value head, its optimizer and the step's (features, rewards) it trains on after the update."""

    FILE = "value_head.pt"

    def __init__(self, hidden_size: int, cfg: Config, device: torch.device):
        p = cfg.algorithm.critic.params                                     # ValueHeadParams: alpha, lr, steps
        self.head = ValueHead(hidden_size, device)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=p.lr, weight_decay=0.0)
        self.alpha, self.steps, self.group_size = p.alpha, p.steps, cfg.rollout.num_generations
        self._features: torch.Tensor | None = None                                    # [B, H] of this step

    def estimator(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
        """An advantage estimator with the signature of ADVANTAGE_ESTIMATORS (rewards, G, eps, scale) that
        uses V of this step's prompts (`prompt_ids` [N, P]: each prompt repeated G times)."""
        G = self.group_size
        self._features = prompt_features(model, prompt_ids[::G], prompt_mask[::G])   # [B, H]
        with torch.no_grad():
            values = self.head(self._features)                                       # [B]
        return lambda rewards, g, eps, scale: hybrid_advantages(rewards, values.to(rewards.device), g, self.alpha,
                                                                eps, scale)

    def after_step(self, step: int, exp) -> dict[str, float]:
        """`value_steps` AdamW steps on 1/2 mean (V(q_i) - r_i)^2 of the step's rewards."""
        if self._features is None:
            return {}
        rewards = exp.scored.total.to(self._features.device)                          # [N] the rewards advantaged
        losses = []
        for _ in range(self.steps):
            self.optimizer.zero_grad(set_to_none=True)
            loss = value_loss(self.head(self._features), rewards, self.group_size)
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()))
        with torch.no_grad():
            mean_v = float(self.head(self._features).mean())
        self._features = None
        return {"critic/value_loss": losses[0], "critic/value_mean": mean_v}

    def save(self, directory: Path) -> None:
        torch.save({"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()},
                   Path(directory) / self.FILE)

    def load(self, directory: Path) -> None:
        state = torch.load(Path(directory) / self.FILE, weights_only=True, map_location="cpu")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])


def build_critics(cfg: Config, model: torch.nn.Module) -> list[PromptCritic]:
    """`algorithm.critic`: none | value_head (on the policy's hidden size and device)."""
    if cfg.algorithm.critic.name == "none":
        return []
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("algorithm.critic runs in a single process only (the value head is outside DDP / FSDP2)")
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [PromptCritic(inner.config.hidden_size, cfg, next(model.parameters()).device)]


def critic_of(extras: list):
    """The critic among the loop's extras, if any."""
    return next((x for x in extras if isinstance(x, PromptCritic)), None)

