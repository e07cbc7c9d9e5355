"""The `algorithm` section: the GRPO-family variant of a run (advantages, policy loss, KL, aggregation, the
variants' own keys). Each string key names an entry of a registry in grpo/algorithms/; docs/variants.md."""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config.fields import _f


@dataclass(frozen=True)
class AlgorithmConfig:
    preset: str | None = _f(None, "Named variant whose settings form the base layer (`grpo presets` lists them): "
                            "grpo | dapo | dr_grpo | gspo | gfpo | rloo | reinforce_pp | tic_grpo | grpo_lead | "
                            "edge_grpo | gtpo | grpo_s | g2_dpo | dsv32 | lambda_grpo | hybrid_grpo | cispo | sapo | "
                            "vespo | luspo; explicit keys override it.")
    advantage_estimator: str = _f("grpo", "Advantage estimator (registry in grpo/algorithms/advantages.py): grpo | dr_grpo | rloo | reinforce_pp.")
    advantage_eps: float = _f(1e-4, "eps in A = (r - mean) / (std + eps).")
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
    scale_rewards: str = _f("group", "Std used by the grpo estimator (as TRL): group | batch | none (no division). "
                            "advantage_estimator=dr_grpo is an alias of grpo with none (batch is refused); rloo and "
                            "reinforce_pp ignore it.")
    reward_combination: str = _f("sum_then_normalize", "How several reward functions combine (registry in "
                                 "grpo/algorithms/advantages.py): sum_then_normalize | normalize_then_sum (MO-GRPO / GDPO).")
    importance_sampling_level: str = _f("token", "Importance ratio (registry in grpo/algorithms/loss.py): token (GRPO) | "
                                        "sequence (GSPO: length-normalised sequence ratio) | trajectory (TIC-GRPO: "
                                        "pi_theta(o|q) / pi_old(o|q), the whole completion's ratio).")
    clip_ratio_c: float | None = _f(None, "Dual-clip constant c > 1 (verl clip_ratio_c, e.g. 3.0): caps the loss of "
                                    "A < 0 tokens at -c * A; empty = off.")
    policy_loss: str = _f("clip", "Per-token policy term (registry in grpo/algorithms/policy_losses.py): clip (PPO / "
                          "GRPO) | cispo (MiniMax-M1: clipped, detached IS weight x A x log pi) | sapo (soft sigmoid "
                          "gate) | vespo (sequence gamma weight x A x log pi).")
    clip_delta: float | None = _f(None, "INTELLECT-2's delta > 1 + epsilon_high (TRL delta): the unclipped ratio is "
                                  "capped at delta too, a two-sided clip for A < 0 (clip only); empty = off.")
    cispo_max: float = _f(5.0, "CISPO: the importance weight is min(r, cispo_max) (ScaleRL's eps_max; TRL's "
                          "epsilon_high under loss_type cispo).")
    sapo_tau_pos: float = _f(1.0, "SAPO gate temperature for A > 0.")
    sapo_tau_neg: float = _f(1.05, "SAPO gate temperature for A <= 0 (the paper: > sapo_tau_pos).")
    vespo_k_pos: float = _f(2.0, "VESPO phi(w) = exp(lambda + k log w - lambda w): k for A >= 0.")
    vespo_lambda_pos: float = _f(3.0, "VESPO lambda for A >= 0.")
    vespo_k_neg: float = _f(3.0, "VESPO k for A < 0.")
    vespo_lambda_neg: float = _f(2.0, "VESPO lambda for A < 0.")
    entropy_coef: float = _f(0.0, "Entropy bonus: loss -= entropy_coef * H, aggregated like the policy term (0 = off); "
                             "with entropy_control adaptive, the starting coefficient.")
    entropy_control: str = _f("fixed", "How the entropy coefficient moves (registry in "
                              "grpo/algorithms/entropy_control.py): fixed | adaptive (Skywork-OR1: +-entropy_coef_delta "
                              "per optimizer step towards entropy_target, applied only while the entropy is at or "
                              "below it; TRL use_adaptive_entropy).")
    entropy_target: float = _f(0.2, "adaptive: target mean token entropy in nats (set it near the entropy of early "
                               "training, metric policy/entropy).")
    entropy_coef_delta: float = _f(0.005, "adaptive: change of the coefficient per optimizer step.")
    entropy_coef_min: float = _f(0.0, "adaptive: lower bound of the coefficient.")
    entropy_coef_max: float = _f(1.0, "adaptive: upper bound of the coefficient.")
    top_entropy_rho: float = _f(1.0, "Train only on this fraction of the batch's active tokens with the highest "
                                "entropy (\"80/20\": 0.2; 1.0 = all tokens).")
    kl_in: str = _f("loss", "Where the beta * KL penalty goes: loss (GRPO) | reward (subtracted from the outcome reward).")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop groups whose rewards all tie and generate more.")
    max_sampling_tries: int = _f(3, "Cap on the extra generation rounds of dynamic sampling.")
    gfpo_sample_size: int = _f(0, "GFPO: sample k completions per prompt and keep the best G "
                               "(k > rollout.num_generations; 0 = off).")
    gfpo_metric: str = _f("length", "GFPO filter metric (registry in grpo/algorithms/shaping.py): length (shorter kept) | "
                          "token_efficiency (reward / length, higher kept).")
    overlong_filter: bool = _f(False, "DAPO overlong filtering: truncated completions are masked out of the loss.")
    overlong_cache_fraction: float = _f(0.0, "DAPO soft overlong punishment: L_cache as a fraction of "
                                        "rollout.max_new_tokens (DAPO: 0.2; 0 = off). The canonical way; the "
                                        "soft_overlong reward is the same penalty as a reward function, and giving "
                                        "both is an error.")
    overlong_penalty_factor: float = _f(1.0, "Scale of the soft overlong penalty added to the reward.")
    ref_update_steps: int = _f(0, "Refresh the reference policy every this many steps (0 = never).")
    ref_mix_alpha: float = _f(1.0, "Reference refresh: ref <- alpha * policy + (1 - alpha) * ref (1.0 = copy).")
    # -- DeepSeek-V3.2's stabilisers and rollout correction (grpo/algorithms/stabilisers.py, issue 21)
    kl_ratio_correction: bool = _f(False, "Unbiased KL (DeepSeek-V3.2 eq. 7; TRL use_bias_correction_kl): the KL "
                                   "estimate times the importance ratio pi_theta / pi_old of importance_sampling_level.")
    off_policy_mask_threshold: float | None = _f(None, "Off-policy sequence masking (DeepSeek-V3.2 eq. 9; TRL "
                                                 "off_policy_mask_threshold, e.g. 0.5): completions with A < 0 whose "
                                                 "off_policy_mask_measure to the sampling policy exceeds this leave the "
                                                 "policy term; empty = off.")
    off_policy_mask_measure: str = _f("kl", "What off_policy_mask_threshold bounds (registry in "
                                      "grpo/algorithms/stabilisers.py): kl (mean log pi_sampler - log pi_theta over the "
                                      "completion) | ratio (its length-normalised ratio s or 1/s, threshold c > 1).")
    beta_by_domain: dict[str, float] = _f({}, "Per-domain KL coefficient (DeepSeek-V3.2), e.g. {math: 0.04, code: "
                                          "0.0}: each row's beta is looked up by its data.domain column value "
                                          "(algorithm.domain_column); other rows use algorithm.beta, which must be > 0.")
    domain_column: str = _f("domain", "Dataset column naming each row's domain, for beta_by_domain.")
    rollout_correction: str = _f("none", "Truncated / masked importance sampling of the policy term by pi_old / "
                                 "pi_sampler, for rollouts computed on another numeric path (bf16 sampler, other "
                                 "kernels): none | token_truncate | token_mask | sequence_truncate | sequence_mask "
                                 "(TRL vllm_importance_sampling_mode; TIS truncates, MIS zeroes). Needs the "
                                 "sampler's log-probs (temperature > 0, no top-k / top-p).")
    rollout_correction_min: float | None = _f(None, "Lower bound C_min of the rollout_correction weight (empty = none).")
    rollout_correction_max: float | None = _f(3.0, "Upper bound C_max of the rollout_correction weight (TRL: 3.0).")
    # -- lambda-GRPO (grpo/algorithms/token_preference.py, issue 21)
    token_preference: str = _f("none", "Learnable token preference: none | lambda (lambda-GRPO: completion i of a group "
                               "weighs f_i = G softmax(h_i^lambda), h_i = 1 + lambda_r z_i, z_i its standardised length; "
                               "use with loss_agg_mode token-mean). Single process only.")
    lambda_init: float = _f(0.0, "lambda-GRPO: initial lambda (0 = DAPO's token mean).")
    lambda_r: float = _f(0.5, "lambda-GRPO: the lift r in h = 1 + r z (h is kept >= 1e-3).")
    lambda_lr: float = _f(1e-2, "lambda-GRPO: AdamW learning rate of lambda (its own optimizer group, no weight decay).")
    # -- Hybrid GRPO (grpo/algorithms/hybrid.py, grpo/training/critic.py, issue 21)
    critic: str = _f("none", "Hybrid GRPO's critic: none | value_head (a linear value head on the policy's detached last "
                     "hidden state of the prompt, trained by 1/2 (V(q) - r)^2). Its advantage replaces "
                     "advantage_estimator: A_i = (r_i - b_q) / std, b_q = hybrid_alpha mean_g(r) + (1 - hybrid_alpha) V(q). "
                     "Single process only.")
    hybrid_alpha: float = _f(0.5, "Hybrid GRPO: weight of the group's mean reward in the baseline (1 = GRPO, 0 = "
                             "the critic alone).")
    value_lr: float = _f(1e-3, "Hybrid GRPO: AdamW learning rate of the value head (its own optimizer).")
    value_steps: int = _f(1, "Hybrid GRPO: value-head optimizer steps on each step's prompts and rewards.")
    # -- GRPO-LEAD, EDGE-GRPO, GTPO / GRPO-S (grpo/algorithms/lead.py, entropy_advantages.py; issue 21)
    correctness_reward: str = _f("", "The reward function whose value > 0 marks a completion correct, for "
                                 "length_reward_alpha, wrong_answer_penalty, difficulty_weighting, entropy_advantage and "
                                 "guided_error_correction (empty = the first reward function).")
    length_reward_alpha: float = _f(0.0, "GRPO-LEAD length-dependent accuracy: a correct completion's correctness "
                                    "reward becomes exp(-alpha z), z its length standardised among the group's "
                                    "correct completions (GRPO-LEAD: 0.05; 0 = off).")
    wrong_answer_penalty: float = _f(0.0, "GRPO-LEAD explicit penalty: a wrong completion's correctness reward becomes "
                                     "-this (GRPO-LEAD: 1.0; 0 = leave it as the function returned it).")
    difficulty_weighting: str = _f("none", "Advantage weights by the group's accuracy rho (registry in "
                                   "grpo/algorithms/lead.py): none | lead (GRPO-LEAD: A > 0 times w(rho), A <= 0 "
                                   "times w(1 - rho), w the logistic below).")
    difficulty_weight_min: float = _f(0.4, "GRPO-LEAD logistic w(rho) = min + (max - min) / (1 + exp(k (rho - rho_0))): min.")
    difficulty_weight_max: float = _f(1.5, "... its max (the weight of the hardest prompts).")
    difficulty_midpoint: float = _f(0.75, "... its midpoint rho_0.")
    difficulty_steepness: float = _f(10.0, "... its steepness k.")
    entropy_advantage: str = _f("none", "Entropy-shaped advantages (registry in grpo/algorithms/entropy_advantages.py): "
                                "none | edge (EDGE-GRPO: A_i x mean_batch(H) / H_i) | gtpo (GTPO: entropy-weighted "
                                "token rewards) | grpo_s (GRPO-S: entropy-weighted sequence rewards). H = the "
                                "policy's token entropy at sampling time (one extra no-grad pass). A group whose "
                                "rewards tie gets no advantage, as in GRPO.")
    entropy_reward_weight: float = _f(0.1, "GTPO / GRPO-S: the weight alpha_2 (beta_2) of the entropy term in the shaped "
                                      "reward, the outcome's weight being 1 (GTPO's experiments: 0.1).")
    guided_error_correction: bool = _f(False, "EDGE-GRPO guided error correction: in a group with no correct completion, "
                                       "the last completion is replaced by the row's reference solution "
                                       "(algorithm.solution_column) and scored again; rows without one are left alone.")
    solution_column: str = _f("solution", "Dataset column with the reference solution text, for guided_error_correction.")
