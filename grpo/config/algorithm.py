"""The `algorithm` section: the GRPO-family variant of a run (advantages, policy loss, KL, aggregation, the
variants). Each string key names an entry of a registry in grpo/algorithms/; a variant key (grpo/config/variants.py)
names one together with the entry's own parameters, `policy_loss: {name: sapo, tau_pos: 1.2}` or just
`policy_loss: sapo`; docs/variants.md."""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config.fields import _f
from grpo.config.variants import Variant, resolve_fields, variant_field


@dataclass(frozen=True)
class AlgorithmConfig:
    preset: str | None = _f(None, "Named variant whose settings form the base layer (`grpo presets` lists them): "
                            "grpo | dapo | dr_grpo | gspo | gfpo | rloo | reinforce_pp | tic_grpo | grpo_lead | "
                            "edge_grpo | gtpo | grpo_s | g2_dpo | dsv32 | lambda_grpo | hybrid_grpo | cispo | sapo | "
                            "vespo | luspo; explicit keys override it.")
    advantage: Variant = variant_field("advantage", "Advantage estimator (registry in "
                                       "grpo/algorithms/advantages.py) and its parameters: grpo (A = (r - mean) / "
                                       "(std + eps); eps, scale_rewards: group | batch | none) | dr_grpo (A = r - "
                                       "mean; eps) | rloo (leave-one-out baseline; eps) | reinforce_pp (group mean, "
                                       "then batch whitening; eps). Flat aliases: advantage_estimator (the entry), "
                                       "advantage_eps, scale_rewards.")
    epsilon: float = _f(0.2, "Lower clip range of the importance ratio: 1 - epsilon.")
    epsilon_high: float | None = _f(None, "Upper clip range 1 + epsilon_high (default: epsilon; DAPO: 0.28).")
    beta: float = _f(0.04, "KL coefficient; 0 skips the reference model entirely.")
    kl_estimator: str = _f("k3", "KL estimator (registry in grpo/algorithms/loss.py): k3 | k1 | k2.")
    loss_agg_mode: str = _f("seq-mean-token-mean", "Loss aggregation (registry in grpo/algorithms/loss.py): seq-mean-token-mean | "
                            "token-mean | seq-mean-token-sum | seq-mean-token-sum-norm.")
    loss_norm_length: int = _f(0, "Constant L of seq-mean-token-sum-norm (0 = rollout.max_new_tokens).")
    num_iterations: int = _f(1, "mu: passes over each generation batch (old log-probs stored when > 1).")
    mini_batches: int = _f(1, "PPO mini-batches: each pass splits the step's groups into this many equal parts, one "
                           "optimizer update each (verl: ppo_mini_batch_size = prompts_per_step / mini_batches; TRL: "
                           "steps_per_generation / gradient_accumulation_steps). Updates per step = num_iterations x "
                           "mini_batches; with more than one, the old policy's log-probs are stored.")

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per generation batch: num_iterations x mini_batches."""
        return self.num_iterations * self.mini_batches
    reward_combination: str = _f("sum_then_normalize", "How several reward functions combine (registry in "
                                 "grpo/algorithms/advantages.py): sum_then_normalize | normalize_then_sum (MO-GRPO / GDPO).")
    importance_sampling_level: str = _f("token", "Importance ratio (registry in grpo/algorithms/loss.py): token (GRPO) | "
                                        "sequence (GSPO: length-normalised sequence ratio) | trajectory (TIC-GRPO: "
                                        "pi_theta(o|q) / pi_old(o|q), the whole completion's ratio).")
    policy_loss: Variant = variant_field("policy_loss", "Per-token policy term (registry in "
                                         "grpo/algorithms/policy_losses.py) and its parameters: clip (PPO / GRPO; "
                                         "ratio_c: dual clip, delta: INTELLECT-2) | cispo (MiniMax-M1: clipped, "
                                         "detached IS weight x A x log pi; max) | sapo (soft sigmoid gate; tau_pos, "
                                         "tau_neg) | vespo (sequence gamma weight x A x log pi; k_pos, lambda_pos, "
                                         "k_neg, lambda_neg).")
    entropy_coef: float = _f(0.0, "Entropy bonus: loss -= entropy_coef * H, aggregated like the policy term (0 = off); "
                             "with entropy_control adaptive, the starting coefficient.")
    entropy_control: Variant = variant_field("entropy_control", "How the entropy coefficient moves "
                                             "(registry in grpo/algorithms/entropy_control.py): fixed | adaptive "
                                             "(Skywork-OR1: +-delta per optimizer step towards target, within "
                                             "[coef_min, coef_max], applied only while the entropy is at or below "
                                             "the target; TRL use_adaptive_entropy).")
    top_entropy_rho: float = _f(1.0, "Train only on this fraction of the batch's active tokens with the highest "
                                "entropy (\"80/20\": 0.2; 1.0 = all tokens).")
    kl_in: str = _f("loss", "Where the beta * KL penalty goes: loss (GRPO) | reward (subtracted from the outcome reward).")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop groups whose rewards all tie and generate more.")
    max_sampling_tries: int = _f(3, "Cap on the extra generation rounds of dynamic sampling.")
    gfpo_filter: Variant = variant_field("gfpo_filter", "GFPO: sample sample_size = k completions per "
                                         "prompt and keep the best G by a metric (registry in "
                                         "grpo/algorithms/shaping.py): length (shorter kept) | token_efficiency "
                                         "(reward / length, higher kept); sample_size 0 = off.")
    overlong_filter: bool = _f(False, "DAPO overlong filtering: truncated completions are masked out of the loss.")
    overlong_cache_fraction: float = _f(0.0, "DAPO soft overlong punishment: L_cache as a fraction of "
                                        "rollout.max_new_tokens (DAPO: 0.2; 0 = off). The canonical way; the "
                                        "soft_overlong reward is the same penalty as a reward function, and giving "
                                        "both is an error.")
    overlong_penalty_factor: float = _f(1.0, "Scale of the soft overlong penalty added to the reward.")
    ref_update_steps: int = _f(0, "Refresh the reference policy every this many steps (0 = never).")
    ref_mix_alpha: float = _f(1.0, "Reference refresh: ref <- alpha * policy + (1 - alpha) * ref (1.0 = copy).")
    # -- DeepSeek-V3.2's stabilisers and rollout correction (grpo/algorithms/stabilisers.py)
    kl_ratio_correction: bool = _f(False, "Unbiased KL (DeepSeek-V3.2 eq. 7; TRL use_bias_correction_kl): the KL "
                                   "estimate times the importance ratio pi_theta / pi_old of importance_sampling_level.")
    off_policy_mask: Variant = variant_field("off_policy_mask", "Off-policy sequence masking (DeepSeek-V3.2 "
                                             "eq. 9): completions with A < 0 whose measure to the sampling policy "
                                             "exceeds threshold leave the policy term (registry in "
                                             "grpo/algorithms/stabilisers.py): kl (mean log pi_sampler - log "
                                             "pi_theta over the completion; TRL off_policy_mask_threshold, e.g. 0.5) "
                                             "| ratio (its length-normalised ratio s or 1/s, threshold c > 1); no "
                                             "threshold = off. Flat aliases: off_policy_mask_measure (the entry), "
                                             "off_policy_mask_threshold.")
    beta_by_domain: dict[str, float] = _f({}, "Per-domain KL coefficient (DeepSeek-V3.2), e.g. {math: 0.04, code: "
                                          "0.0}: each row's beta is looked up by its data.domain column value "
                                          "(algorithm.domain_column); other rows use algorithm.beta, which must be > 0.")
    domain_column: str = _f("domain", "Dataset column naming each row's domain, for beta_by_domain.")
    rollout_correction: Variant = variant_field("rollout_correction", "Truncated / masked importance "
                                                "sampling of the policy term by pi_old / pi_sampler, for rollouts "
                                                "computed on another numeric path (bf16 sampler, other kernels): none "
                                                "| token_truncate | token_mask | sequence_truncate | sequence_mask "
                                                "(TRL vllm_importance_sampling_mode; TIS truncates, MIS zeroes), each "
                                                "with bounds min, max. Needs the sampler's log-probs (temperature > "
                                                "0, no top-k / top-p).")
    # -- lambda-GRPO (grpo/algorithms/token_preference.py)
    token_preference: Variant = variant_field("token_preference", "Learnable token preference: none | "
                                              "lambda (lambda-GRPO: completion i of a group weighs f_i = G "
                                              "softmax(h_i^lambda), h_i = 1 + r z_i, z_i its standardised length; "
                                              "parameters init, r, lr; use with loss_agg_mode token-mean). Single "
                                              "process only.")
    # -- Hybrid GRPO (grpo/algorithms/hybrid.py, grpo/training/critic.py)
    critic: Variant = variant_field("critic", "Hybrid GRPO's critic: none | value_head (a linear value head "
                                    "on the policy's detached last hidden state of the prompt, trained by 1/2 (V(q) - "
                                    "r)^2; parameters alpha, lr, steps). Its advantage replaces the estimator "
                                    "(algorithm.advantage must be grpo: its eps and scale_rewards are the critic's): "
                                    "A_i = (r_i - b_q) / std, b_q = alpha mean_g(r) + (1 - alpha) V(q). Single "
                                    "process only.")
    # -- GRPO-LEAD, EDGE-GRPO, GTPO / GRPO-S (grpo/algorithms/lead.py, entropy_advantages.py)
    correctness_reward: str = _f("", "The reward function whose value > 0 marks a completion correct, for "
                                 "length_reward_alpha, wrong_answer_penalty, difficulty_weighting, entropy_advantage and "
                                 "guided_error_correction (empty = the first reward function).")
    length_reward_alpha: float = _f(0.0, "GRPO-LEAD length-dependent accuracy: a correct completion's correctness "
                                    "reward becomes exp(-alpha z), z its length standardised among the group's "
                                    "correct completions (GRPO-LEAD: 0.05; 0 = off).")
    wrong_answer_penalty: float = _f(0.0, "GRPO-LEAD explicit penalty: a wrong completion's correctness reward becomes "
                                     "-this (GRPO-LEAD: 1.0; 0 = leave it as the function returned it).")
    difficulty_weighting: Variant = variant_field("difficulty_weighting", "Advantage weights by the "
                                                  "group's accuracy rho (registry in grpo/algorithms/lead.py): none | "
                                                  "lead (GRPO-LEAD: A > 0 times w(rho), A <= 0 times w(1 - rho), w(rho) "
                                                  "= w_min + (w_max - w_min) / (1 + exp(steepness (rho - midpoint)))).")
    entropy_advantage: Variant = variant_field("entropy_advantage", "Entropy-shaped advantages (registry in "
                                               "grpo/algorithms/entropy_advantages.py): none | edge (EDGE-GRPO: A_i x "
                                               "mean_batch(H) / H_i) | gtpo (GTPO: entropy-weighted token rewards; "
                                               "reward_weight) | grpo_s (GRPO-S: entropy-weighted sequence rewards; "
                                               "reward_weight). H = the policy's token entropy at sampling time (one "
                                               "extra no-grad pass). A group whose rewards tie gets no advantage, as "
                                               "in GRPO.")
    guided_error_correction: bool = _f(False, "EDGE-GRPO guided error correction: in a group with no correct completion, "
                                       "the last completion is replaced by the row's reference solution "
                                       "(algorithm.solution_column) and scored again; rows without one are left alone.")
    solution_column: str = _f("solution", "Dataset column with the reference solution text, for guided_error_correction.")

    def __post_init__(self) -> None:
        resolve_fields(self, "algorithm")     # a name or {name, parameters} -> Variant, checked against its entry
