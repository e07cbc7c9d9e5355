"""Named algorithm presets: each GRPO-family variant as a set of config values.

A preset is the lowest layer of a config: defaults < preset < YAML file < command-line options,
so any explicit option overrides it (`grpo train --algorithm dapo --algorithm.beta 0.01`).
`grpo presets` prints this table; docs/algorithm.md explains each option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    paper: str                    # where the settings come from
    summary: str                  # one line: what the variant changes
    values: dict[str, Any]        # flat `section.key` -> value


_GRPO_BASE = {
    "algorithm.advantage_estimator": "grpo", "algorithm.scale_rewards": "group", "algorithm.beta": 0.04,
    "algorithm.kl_estimator": "k3", "algorithm.kl_in": "loss", "algorithm.epsilon": 0.2,
    "algorithm.epsilon_high": None, "algorithm.loss_agg_mode": "seq-mean-token-mean",
    "algorithm.importance_sampling_level": "token",
}

PRESETS: dict[str, Preset] = {
    "grpo": Preset(
        "DeepSeekMath (Shao et al., 2024)",
        "group mean/std advantages, clipped token ratio, k3 KL in the loss, per-completion token mean",
        dict(_GRPO_BASE)),
    "dapo": Preset(
        "DAPO (Yu et al., 2025)",
        "no KL, clip-higher 0.28, token-level loss, dynamic sampling, soft overlong punishment",
        {**_GRPO_BASE, "algorithm.beta": 0.0, "algorithm.epsilon_high": 0.28,
         "algorithm.loss_agg_mode": "token-mean", "algorithm.dynamic_sampling": True,
         "algorithm.overlong_cache_fraction": 0.2, "algorithm.overlong_penalty_factor": 1.0}),
    "dr_grpo": Preset(
        "Dr. GRPO (Liu et al., 2025, Understanding R1-Zero-Like Training)",
        "no std division, token sum over a constant length (no length bias), no KL",
        {**_GRPO_BASE, "algorithm.advantage_estimator": "dr_grpo", "algorithm.scale_rewards": "none",
         "algorithm.beta": 0.0, "algorithm.loss_agg_mode": "seq-mean-token-sum-norm"}),
    "gspo": Preset(
        "GSPO (Zheng et al., 2025, Group Sequence Policy Optimization)",
        "length-normalised sequence-level ratio, clip range 3e-4 / 4e-4, no KL",
        {**_GRPO_BASE, "algorithm.importance_sampling_level": "sequence", "algorithm.epsilon": 3e-4,
         "algorithm.epsilon_high": 4e-4, "algorithm.beta": 0.0}),
    "gfpo": Preset(
        "GFPO (Shrivastava et al., 2025, Sample More to Think Less)",
        "sample k = 16 per prompt, keep the G = 8 with the best reward per token, then GRPO",
        {**_GRPO_BASE, "rollout.num_generations": 8, "algorithm.gfpo_sample_size": 16,
         "algorithm.gfpo_metric": "token_efficiency"}),
    "rloo": Preset(
        "RLOO (Ahmadian et al., 2024, Back to Basics)",
        "leave-one-out baseline, KL penalty in the reward (k1), no std scaling",
        {**_GRPO_BASE, "algorithm.advantage_estimator": "rloo", "algorithm.scale_rewards": "none",
         "algorithm.kl_in": "reward", "algorithm.kl_estimator": "k1", "algorithm.beta": 0.05}),
    "reinforce_pp": Preset(
        "REINFORCE++ (Hu, 2025)",
        "group-mean baseline then batch whitening, KL penalty in the reward (k1), token-level loss",
        {**_GRPO_BASE, "algorithm.advantage_estimator": "reinforce_pp", "algorithm.kl_in": "reward",
         "algorithm.kl_estimator": "k1", "algorithm.beta": 0.01, "algorithm.loss_agg_mode": "token-mean"}),
}


def preset_values(name: str) -> dict[str, Any]:
    """The flat `section.key` values of a preset; an unknown name is a one-line error."""
    from grpo.config import ConfigError

    if name not in PRESETS:
        raise ConfigError(f"unknown algorithm preset '{name}'; choose from {', '.join(PRESETS)}")
    return dict(PRESETS[name].values)


def format_presets() -> str:
    """Every preset with its paper and settings, as printed by `grpo presets`."""
    lines = []
    for name, p in PRESETS.items():
        lines.append(f"{name}: {p.summary}\n  paper: {p.paper}")
        lines += [f"  {key:40s} {value!r}" for key, value in p.values.items()]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
