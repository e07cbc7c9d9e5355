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
    values: dict[str, Any]        # `section.key` -> value; a variant key: its entry's name or {name, parameters}


_GRPO_BASE = {
    "algorithm.advantage": {"name": "grpo", "scale_rewards": "group"}, "algorithm.beta": 0.04,
    "algorithm.kl_estimator": "k3", "algorithm.kl_in": "loss", "algorithm.epsilon": 0.2,
    "algorithm.epsilon_high": None, "algorithm.loss_agg_mode": "seq-mean-token-mean",
    "algorithm.importance_sampling_level": "token", "algorithm.policy_loss": "clip",
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
        {**_GRPO_BASE, "algorithm.advantage": "dr_grpo",
         "algorithm.beta": 0.0, "algorithm.loss_agg_mode": "seq-mean-token-sum-norm"}),
    "gspo": Preset(
        "GSPO (Zheng et al., 2025, Group Sequence Policy Optimization)",
        "length-normalised sequence-level ratio, clip range 3e-4 / 4e-4, no KL",
        {**_GRPO_BASE, "algorithm.importance_sampling_level": "sequence", "algorithm.epsilon": 3e-4,
         "algorithm.epsilon_high": 4e-4, "algorithm.beta": 0.0}),
    "gfpo": Preset(
        "GFPO (Shrivastava et al., 2025, Sample More to Think Less)",
        "sample k = 16 per prompt, keep the G = 8 with the best reward per token, then GRPO",
        {**_GRPO_BASE, "rollout.num_generations": 8,
         "algorithm.gfpo_filter": {"name": "token_efficiency", "sample_size": 16}}),
    "rloo": Preset(
        "RLOO (Ahmadian et al., 2024, Back to Basics)",
        "leave-one-out baseline, KL penalty in the reward (k1), no std scaling",
        {**_GRPO_BASE, "algorithm.advantage": "rloo",
         "algorithm.kl_in": "reward", "algorithm.kl_estimator": "k1", "algorithm.beta": 0.05}),
    "reinforce_pp": Preset(
        "REINFORCE++ (Hu, 2025)",
        "group-mean baseline then batch whitening, KL penalty in the reward (k1), token-level loss",
        {**_GRPO_BASE, "algorithm.advantage": "reinforce_pp", "algorithm.kl_in": "reward",
         "algorithm.kl_estimator": "k1", "algorithm.beta": 0.01, "algorithm.loss_agg_mode": "token-mean"}),
    # -- TIC-GRPO, GRPO-LEAD, EDGE-GRPO, GTPO / GRPO-S, 2-GRPO (docs/variants.md)
    "tic_grpo": Preset(
        "TIC-GRPO (Pang et al., 2025, arXiv 2508.02833)",
        "one trajectory-level ratio pi_theta(o|q) / pi_old(o|q) instead of per-token ratios (differs from GRPO "
        "only when num_iterations > 1)",
        {**_GRPO_BASE, "algorithm.importance_sampling_level": "trajectory"}),
    "grpo_lead": Preset(
        "GRPO-LEAD (Zhang & Zuo, 2025, arXiv 2504.09696)",
        "correct answers rewarded exp(-0.05 z) (z: length standardised among the group's correct ones), wrong "
        "ones -1, advantages weighted by a logistic of the group's accuracy, no KL",
        {**_GRPO_BASE, "rollout.num_generations": 8, "algorithm.beta": 0.0, "algorithm.length_reward_alpha": 0.05,
         "algorithm.wrong_answer_penalty": 1.0,
         "algorithm.difficulty_weighting": {"name": "lead", "w_min": 0.4, "w_max": 1.5, "midpoint": 0.75,
                                            "steepness": 10.0}}),
    "edge_grpo": Preset(
        "EDGE-GRPO (Zhang et al., 2025, arXiv 2507.21848)",
        "entropy-driven advantage A_i x mean(H) / H_i, guided error correction (a reference solution in groups "
        "with no correct answer), no KL",
        {**_GRPO_BASE, "algorithm.beta": 0.0, "algorithm.entropy_advantage": {"name": "edge"},
         "algorithm.guided_error_correction": True}),
    "gtpo": Preset(
        "GTPO (Tan et al., 2025, arXiv 2508.04349)",
        "entropy-weighted token rewards (high-entropy tokens of correct completions gain, of wrong ones lose), "
        "token-level advantages, on DAPO's loss",
        {**_GRPO_BASE, "algorithm.beta": 0.0, "algorithm.epsilon_high": 0.28, "algorithm.loss_agg_mode": "token-mean",
         "algorithm.entropy_advantage": {"name": "gtpo", "reward_weight": 0.1}}),
    "grpo_s": Preset(
        "GRPO-S (Tan et al., 2025, arXiv 2508.04349)",
        "entropy-weighted sequence rewards from each completion's mean token entropy, on DAPO's loss",
        {**_GRPO_BASE, "algorithm.beta": 0.0, "algorithm.epsilon_high": 0.28, "algorithm.loss_agg_mode": "token-mean",
         "algorithm.entropy_advantage": {"name": "grpo_s", "reward_weight": 0.1}}),
    "g2_dpo": Preset(
        "It Takes Two: Your GRPO Is Secretly DPO (Wu et al., 2025, arXiv 2510.00977)",
        "2-GRPO: G = 2 with the k3 KL in the loss and a token-sum aggregation; at pi = pi_ref (mu = 1) its gradient "
        "is on-policy DPO's over the sampled pair (docs/variants.md, 'G = 2 and DPO')",
        {**_GRPO_BASE, "rollout.num_generations": 2, "algorithm.loss_agg_mode": "seq-mean-token-sum"}),
    # -- DeepSeek-V3.2's stabilisers (grpo/algorithms/stabilisers.py)
    "dsv32": Preset(
        "DeepSeek-V3.2 (DeepSeek-AI, 2025, arXiv 2512.02556), section 3.1",
        "no std division, unbiased KL (k3 x importance ratio), off-policy sequence masking (delta = 0.5: TRL's "
        "example value, the paper gives none)",
        {**_GRPO_BASE, "algorithm.advantage": {"name": "grpo", "scale_rewards": "none"},
         "algorithm.kl_ratio_correction": True, "algorithm.off_policy_mask": {"name": "kl", "threshold": 0.5}}),
    "lambda_grpo": Preset(
        "lambda-GRPO (Wang et al., 2025, arXiv 2510.06870)",
        "token-level loss whose per-completion weights G softmax(h^lambda) (h from the standardised length) are "
        "learnt with the policy through lambda (lambda = 0: DAPO's token mean)",
        {**_GRPO_BASE, "algorithm.loss_agg_mode": "token-mean",
         "algorithm.token_preference": {"name": "lambda", "init": 0.0, "r": 0.5, "lr": 0.01}}),
    "hybrid_grpo": Preset(
        "Hybrid GRPO (Sane, 2025, arXiv 2502.01652)",
        "a value head on the policy next to the group baseline: A_i = (r_i - (0.5 mean_g r + 0.5 V(q))) / std",
        {**_GRPO_BASE, "algorithm.critic": {"name": "value_head", "alpha": 0.5}}),
    # -- the policy losses of TRL 1.16's loss_type (grpo/algorithms/policy_losses.py)
    "cispo": Preset(
        "CISPO (MiniMax-M1, arXiv 2506.13585); cap 5.0: ScaleRL's eps_max (arXiv 2510.13786) as TRL documents it",
        "clipped, detached importance weight min(r, 5) x A x log pi (every token keeps its gradient), token-level "
        "loss, no KL",
        {**_GRPO_BASE, "algorithm.policy_loss": {"name": "cispo", "max": 5.0}, "algorithm.beta": 0.0,
         "algorithm.loss_agg_mode": "token-mean"}),
    "sapo": Preset(
        "SAPO (Gao et al., 2025, arXiv 2511.20347)",
        "soft sigmoid gate (4 / tau) sigmoid(tau (r - 1)) instead of the hard clip, tau 1.0 for A > 0 and 1.05 "
        "otherwise, per-completion token mean, no KL",
        {**_GRPO_BASE, "algorithm.policy_loss": {"name": "sapo", "tau_pos": 1.0, "tau_neg": 1.05},
         "algorithm.beta": 0.0}),
    "vespo": Preset(
        "VESPO (arXiv 2602.10693), constants and aggregation of TRL 1.16's loss_type vespo",
        "sequence-level gamma weight phi(w) = exp(lambda + k log w - lambda w) x A x log pi, (k, lambda) = (2, 3) "
        "for A >= 0 and (3, 2) otherwise, token-level loss, no KL",
        {**_GRPO_BASE, "algorithm.beta": 0.0, "algorithm.loss_agg_mode": "token-mean",
         "algorithm.policy_loss": {"name": "vespo", "k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}}),
    "luspo": Preset(
        "LUSPO (arXiv 2602.05261), on GSPO's settings",
        "GSPO with each completion's loss scaled by its length: sequence ratio, token sum per completion, mean "
        "over completions, no KL",
        {**_GRPO_BASE, "algorithm.importance_sampling_level": "sequence", "algorithm.epsilon": 3e-4,
         "algorithm.epsilon_high": 4e-4, "algorithm.beta": 0.0, "algorithm.loss_agg_mode": "seq-mean-token-sum"}),
}


def preset_values(name: str) -> dict[str, Any]:
    """The `section.key` values of a preset (a variant key's: a name or {name, parameters}); an unknown name is a
    one-line error."""
    from grpo.config.errors import ConfigError

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
