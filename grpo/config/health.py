"""The `health` section: thresholds of the online health rules (grpo/health/, docs/health.md)."""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config.fields import _f


@dataclass(frozen=True)
class HealthConfig:
    """Online health rules (grpo/health/, docs/health.md): each step the run's metric history is checked for
    GRPO's known failure modes; new or worse findings go to the console, output_dir/alerts.jsonl, the
    metrics (health/<rule>) and callbacks (on_alert). B = the median of steps baseline_from..baseline_to;
    Wn = the last n steps; nothing but non_finite fires before step baseline_to."""

    enabled: bool = _f(True, "Run the health rules every step.")
    halt_on: list[str] = _f([], "Rule names whose critical finding stops the run like Ctrl-C (checkpoint saved, "
                            "stopped_by 'health'); e.g. [non_finite, kl_blowup]. Default: never stop.")
    baseline_from: int = _f(10, "First step of the baseline window B.")
    baseline_to: int = _f(30, "Last step of the baseline window B; no rule but non_finite fires before it.")
    flat_reward: float = _f(0.05, "The main (first) reward counts as flat over a window when its least-squares line "
                            "changes by less than this across it (rising: more; falling: less than minus this).")
    dead_groups_warn: float = _f(0.5, "dead_groups: mean share of groups with zero reward spread over W20, warn.")
    dead_groups_critical: float = _f(0.75, "dead_groups: the same share, critical.")
    easy_pass_rate: float = _f(0.85, "dead_groups advice: a main reward mean >= this means the prompts are too easy.")
    hard_pass_rate: float = _f(0.15, "dead_groups advice: a main reward mean <= this means the prompts are too hard.")
    no_update_warn: float = _f(0.4, "no_update: share of W20 steps whose gradient norm is exactly 0, warn.")
    no_update_critical: float = _f(1.0, "no_update: the same share, critical.")
    entropy_collapse_warn: float = _f(0.2, "entropy_collapse: W10 entropy below this x B while the reward is not "
                                      "rising (W20), warn.")
    entropy_collapse_critical: float = _f(0.1, "entropy_collapse: W10 entropy below this x B, critical.")
    entropy_blowup_factor: float = _f(2.0, "entropy_blowup: W10 entropy above max(this x B, B + entropy_blowup_margin) "
                                      "and rising, warn; with the reward falling, critical.")
    entropy_blowup_margin: float = _f(0.5, "entropy_blowup: the additive margin (nats) of the threshold above.")
    kl_warn: float = _f(0.5, "kl_blowup (beta > 0): W10 mean KL above this and rising, warn.")
    kl_critical: float = _f(2.0, "kl_blowup: W10 mean KL above this, critical.")
    spike_mad: float = _f(8.0, "A spike (kl_blowup, grad_spike) lies this many MADs above the median of the steps "
                          "before it (W100)...")
    spike_ratio: float = _f(3.0, "... and above this multiple of that median.")
    kl_spike_min: float = _f(0.1, "kl_blowup: a KL spike counts only above this value (tiny early KLs jump by "
                             "large factors without harm).")
    grad_spike_critical: int = _f(3, "grad_spike: this many spikes of the gradient norm (before clipping) in W50, "
                                  "critical (one: warn).")
    truncation_warn: float = _f(0.10, "truncation: W10 mean share of completions cut at max_new_tokens, warn.")
    truncation_critical: float = _f(0.5, "truncation: the same share, critical.")
    length_inflation_factor: float = _f(1.5, "length_inflation: W10 mean length >= this x B, still growing (by "
                                        "length_growth x B over W25) while the reward is not rising (W25), warn.")
    length_growth: float = _f(0.1, "length_inflation: growth of the length over W25, as a share of B, that counts "
                              "as still growing.")
    length_reward_corr: float = _f(0.75, "length_inflation: W25 mean of the per-step length/reward correlation above "
                                   "this, warn (either condition with truncation rising: critical).")
    length_collapse_factor: float = _f(0.3, "length_collapse: W10 mean length <= this x B while the reward rises (W25), warn.")
    clip_warn: float = _f(0.10, "clip_saturation: W10 mean share of clipped tokens, warn.")
    clip_critical: float = _f(0.30, "clip_saturation: the same share, critical.")
    clip_info: float = _f(0.05, "clip_saturation: above this share, an info finding when low clips are at least "
                          "clip_low_high_ratio x the high clips (clip-higher would help).")
    clip_low_high_ratio: float = _f(3.0, "clip_saturation: the low/high ratio of the info finding.")
    format_saturation: float = _f(0.98, "format_gaming: an auxiliary reward counts as saturated at >= this share of its "
                                  "maximum...")
    format_share: float = _f(0.8, "... in this share of W30, while the main reward has gained no more than flat_reward "
                             "over its baseline (warn) or is falling (critical).")
    repetition_warn: float = _f(0.2, "repetition: W10 mean share of completions with a 4-gram repeated >= 8 times, "
                                "above this and above repetition_factor x B, warn (with truncation: critical).")
    repetition_factor: float = _f(2.0, "repetition: the multiple of the baseline share above.")
    proxy_gap_warn: float = _f(0.15, "proxy_divergence (train.eval_steps): the main reward's gain since the first "
                               "evaluation minus the eval score's gain, warn.")
    proxy_gap_critical: float = _f(0.30, "proxy_divergence: the same gap, critical (or the eval score falling by "
                                   "proxy_gap_warn below its first value).")
