"""Reward-model retraining inside a GRPO run (``reward.reward_model_update``): DeepSeekMath's iterative RL.

DeepSeekMath (4.2, "iterative RL"): every iteration samples from the current policy, retrains the reward
model on those samples with a replay of 10% of the historical data, resets the reference model to the
current policy, and trains on. Here, with ``reward.reward_model_update: {every: N, replay: 0.1, label: F}``:

* every step's completions are labelled by the rule or judge function ``label`` (1 when it gives
  ``>= threshold``, else 0) and queued;
* at every N-th step the reward model of ``reward.functions`` (a sequence-classifier directory) takes
  ``steps`` AdamW steps on the queued samples, each batch holding ``round(replay x batch_size)`` samples
  from the history of earlier iterations (grpo/training/reward_model_training.py); the queue then joins
  the history and the next steps score with the updated model;
* the reference follows the policy with ``algorithm.ref_update_steps: N`` (the same N gives
  DeepSeekMath's iteration; the two keys stay separate so either can be used alone).

Metrics (logged at update steps): ``reward_model/accuracy_before`` (on the new samples, before training:
how well the old model judged the current policy), ``reward_model/accuracy_after``, ``reward_model/loss``,
``reward_model/samples``, ``reward_model/good_share``, ``reward_model/updates``. A checkpoint stores the
reward model's weights (``reward_model/``) and the queue and history (``reward_model_state.json``), so a
resumed run goes on bit for bit. Single-process runs only (under torchrun each rank would train its own copy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo.config import ConfigError
from grpo.rewards import load_reward, score
from grpo.rewards.reward_model import RewardModel, reward_text
from grpo.rewards.text import chat_completions
from grpo.training.reward_model_training import Item, ReplayBuffer, accuracy, train_reward_model

STATE_FILE = "reward_model_state.json"
WEIGHTS_DIR = "reward_model"


def find_reward_model(rewards: list[tuple[str, Any]], wanted: str) -> tuple[str, RewardModel]:
    """The (name, RewardModel) of `rewards` to train: the one named `wanted` (``rm:<dir>`` or its directory
    name), or the only reward model; a one-line ConfigError otherwise."""
    models = [(name, fn) for name, fn in rewards if isinstance(fn, RewardModel)]
    if wanted:
        key = Path(wanted).name
        models = [(n, fn) for n, fn in models if n in (wanted, f"rm:{key}")]
    if len(models) != 1:
        found = ", ".join(n for n, fn in rewards if isinstance(fn, RewardModel)) or "none"
        raise ConfigError(f"reward.reward_model_update needs {'the reward model ' + wanted if wanted else 'one'} "
                          f"reward-model directory in reward.functions (set reward.reward_model_update.model to "
                          f"choose one); reward models found: {found}")
    return models[0]


class RewardModelUpdater:
    """Labels every step's samples and trains the run's reward model every `every` steps (module docstring)."""

    def __init__(self, settings, rewards: list[tuple[str, Any]], seed: int = 0):
        if not settings.label:
            raise ConfigError("reward.reward_model_update.label: name the reward function that labels samples "
                              "(e.g. accuracy), needed with reward_model_update.every > 0")
        self.settings = settings
        self.name, self.rm = find_reward_model(rewards, settings.model)
        self.label = load_reward(settings.label)
        self.seed = seed
        self.pending: list[Item] = []
        self.history = ReplayBuffer()
        self.updates = 0

    def labelled(self, prompts: list, completions: list[str], columns: dict[str, list]) -> list[Item]:
        """(text the reward model reads, special tokens?, 1 good / 0 bad) of every sample."""
        values = score([self.label], None, prompts, chat_completions(prompts, completions), columns).per_function[:, 0]
        return [(*reward_text(self.rm.tokenizer, p, c), int(v == v and v >= self.settings.threshold))
                for p, c, v in zip(prompts, completions, values.tolist())]

    def after_step(self, step: int, exp) -> dict[str, float]:
        """Queue the step's samples; at every `every`-th step train on the queue (with replay). Returns the
        update's metrics, or {} between updates."""
        groups = exp.groups
        self.pending += self.labelled(groups.prompts, groups.completions, groups.columns)
        if step % self.settings.every != 0 or not self.pending:
            return {}
        s, model = self.settings, self.rm.model
        before = accuracy(model, self.rm.tokenizer, self.pending)
        model.requires_grad_(True)
        try:
            losses = train_reward_model(model, self.rm.tokenizer, self.pending, steps=s.steps, batch_size=s.batch_size,
                                        lr=s.lr, loss=s.loss, history=self.history,
                                        replay=s.replay, seed=self.seed * 1_000_003 + step)
        finally:
            model.requires_grad_(False).eval()
        after = accuracy(model, self.rm.tokenizer, self.pending)
        good = sum(it[2] for it in self.pending) / len(self.pending)
        count = len(self.pending)
        self.pending = []                                     # train_reward_model added them to the history
        self.updates += 1
        return {"reward_model/accuracy_before": before, "reward_model/accuracy_after": after,
                "reward_model/loss": sum(losses) / len(losses), "reward_model/samples": float(count),
                "reward_model/good_share": good, "reward_model/updates": float(self.updates)}

    def save(self, directory: Path) -> None:
        """The reward model's weights and the queue / history, into a checkpoint directory."""
        self.rm.model.save_pretrained(directory / WEIGHTS_DIR)
        (directory / STATE_FILE).write_text(json.dumps({"name": self.name, "updates": self.updates,
                                                        "pending": self.pending, "history": self.history.items}))

    def load(self, directory: Path) -> None:
        """Put the reward model, queue and history back as `directory` (a checkpoint) saved them."""
        from grpo.state.resume import load_policy_weights

        if not (directory / STATE_FILE).is_file():
            raise ConfigError(f"{directory.name}: no {STATE_FILE}, needed to resume with reward.reward_model_update")
        saved = json.loads((directory / STATE_FILE).read_text())
        load_policy_weights(self.rm.model, directory / WEIGHTS_DIR)
        self.updates = int(saved["updates"])
        self.pending = [tuple(it) for it in saved["pending"]]
        self.history = ReplayBuffer([tuple(it) for it in saved["history"]])


def build_extras(cfg, rewards: list[tuple[str, Any]], world_size: int = 1) -> list[Any]:
    """The run's stateful additions to the loop (each: after_step, save, load); empty by default."""
    settings = cfg.reward.reward_model_update
    if not settings.every:
        return []
    if world_size > 1:
        raise ConfigError("reward.reward_model_update runs in a single process only (under torchrun every rank "
                          "would train its own reward model); set reward.reward_model_update.every: 0")
    return [RewardModelUpdater(settings, rewards, cfg.train.seed)]
