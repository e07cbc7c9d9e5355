"""The health rules: one pure function per known GRPO failure mode, of the metric history and the config.

Each rule returns None or a :class:`~grpo.health.history.Finding` (info | warn | critical, a message with
the numbers, advice naming config keys). Thresholds are `health.*` config keys (grpo/config/schema.py,
HealthConfig); windows are the constants below. B = a metric's median over steps
`health.baseline_from`..`health.baseline_to`; Wn = its last n steps; "the reward" is the main (first)
reward function's mean, whose trend over a window is the change of its least-squares line
(flat: |change| < `health.flat_reward`). The monitor (grpo/health/monitor.py) runs only non_finite
before step `health.baseline_to`. docs/health.md explains every rule and the runs that calibrated it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from grpo.config import Config
from grpo.health.history import Finding, History, change, nanmean, spike_flags

Rule = Callable[[History, Config], "Finding | None"]
RULES: dict[str, Rule] = {}
EARLY_RULES = frozenset({"non_finite"})     # the only rules that may fire before health.baseline_to


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn
    return register


def _finding(name: str, severity: str, message: str, advice: str, keys: tuple[str, ...], value: float) -> Finding:
    return Finding(name, severity, message, advice, keys, value=float(value))


def main_reward(h: History) -> str | None:
    names = h.reward_names()
    return names[0] if names else None


def reward_trend(h: History, cfg: Config, n: int) -> str:
    """'rising' | 'flat' | 'falling': the main reward's least-squares change over Wn against health.flat_reward."""
    name = main_reward(h)
    if name is None:
        return "flat"
    delta = change(h.last(f"reward/{name}/mean", n))
    flat = cfg.health.flat_reward
    return "rising" if delta > flat else "falling" if delta < -flat else "flat"


def _base(h: History, cfg: Config, key: str) -> float:
    return h.baseline(key, cfg.health.baseline_from, cfg.health.baseline_to)


def _level(value: float, warn: float, critical: float) -> str | None:
    """The severity of `value` against its thresholds: None below `warn`, and for NaN (no data)."""
    return "critical" if value >= critical else "warn" if value >= warn else None


def _windowed(h: History, key: str, window: int, warn: float, critical: float) -> tuple[float, str | None]:
    """The mean of metric `key` over the last `window` steps (NaN without data) and its severity."""
    mean = nanmean(h.last(key, window))
    return mean, _level(mean, warn, critical)


@rule("non_finite")
def non_finite(h: History, cfg: Config) -> Finding | None:
    """Any NaN/Inf in the last step's loss, gradient norm, KL (beta > 0, in the loss), entropy or total reward
    (a total that is NaN only because no function applied is not one): critical."""
    rec = h.records[-1]
    keys = ["loss/total", "optim/grad_norm", "policy/entropy"]
    if cfg.algorithm.beta > 0 and cfg.algorithm.kl_in == "loss":
        keys.append("kl/mean")
    bad = [k for k in keys if k in rec and not (isinstance(rec[k], (int, float)) and math.isfinite(rec[k]))]
    total = rec.get("reward/total/mean")
    applied = any(isinstance(v, (int, float)) and v < 1 for k, v in rec.items() if k.endswith("/none_frac"))
    if applied and not (isinstance(total, (int, float)) and math.isfinite(total)):
        bad.append("reward/total/mean")
    if not bad:
        return None
    return _finding("non_finite", "critical", f"non-finite {', '.join(bad)}",
                    "resume from the last good checkpoint (train.resume) with a lower optim.lr; check "
                    "train.precision and the reward functions", ("train.resume", "optim.lr", "train.precision"),
                    float("nan"))


@rule("dead_groups")
def dead_groups(h: History, cfg: Config) -> Finding | None:
    """Mean share of groups whose rewards all tie (zero advantage, no gradient) over W20."""
    share, severity = _windowed(h, "advantages/zero_std_frac", 20, cfg.health.dead_groups_warn,
                                cfg.health.dead_groups_critical)
    if severity is None:
        return None
    name = main_reward(h)
    rate = nanmean(h.last(f"reward/{name}/mean", 20)) if name else float("nan")
    spread = nanmean(h.last(f"reward/{name}/std", 20)) if name else float("nan")
    if spread == 0.0:
        advice, keys = ("every completion got the same reward in the last 20 steps: check the reward function "
                        "(reward.functions) on known-good and known-bad answers", ("reward.functions",))
    elif rate >= cfg.health.easy_pass_rate:
        advice, keys = ("the prompts are too easy: use harder data (data.dataset) or filter solved prompts; "
                        "algorithm.dynamic_sampling drops tied groups", ("data.dataset", "algorithm.dynamic_sampling"))
    elif rate <= cfg.health.hard_pass_rate:
        advice, keys = ("the prompts are too hard or the verifier never pays: easier data (data.dataset), a larger "
                        "rollout.num_generations, and check the reward function on known-good answers",
                        ("data.dataset", "rollout.num_generations", "reward.functions"))
    else:
        advice, keys = ("raise rollout.num_generations or rollout.temperature for more spread within a group, or "
                        "turn on algorithm.dynamic_sampling", ("rollout.num_generations", "rollout.temperature",
                                                                "algorithm.dynamic_sampling"))
    return _finding("dead_groups", severity, f"{share:.0%} of groups had zero reward spread over the last 20 steps "
                    f"(main reward mean {rate:.2f})", advice, keys, share)


@rule("no_update")
def no_update(h: History, cfg: Config) -> Finding | None:
    """Share of W20 steps whose gradient norm is exactly 0 (nothing learned at all)."""
    grad = h.last("optim/grad_norm", 20)
    grad = grad[np.isfinite(grad)]
    if not grad.size:
        return None
    share = float((grad == 0).mean())
    severity = _level(share, cfg.health.no_update_warn, cfg.health.no_update_critical)
    if severity is None:
        return None
    return _finding("no_update", severity, f"{share:.0%} of the last {grad.size} steps had a zero gradient",
                    "every group tied (see dead_groups): change the data, raise rollout.num_generations, or check "
                    "that reward.functions give different scores", ("rollout.num_generations", "reward.functions"),
                    share)


@rule("entropy_collapse")
def entropy_collapse(h: History, cfg: Config) -> Finding | None:
    """W10 entropy far below its baseline: the policy stopped exploring. When B itself is already below the
    critical share of the first steps' entropy (E0, the median of steps 1..baseline_from - 1: the entropy
    collapsed before or inside the baseline window), E0 is the baseline instead."""
    base, now = _base(h, cfg, "policy/entropy"), nanmean(h.last("policy/entropy", 10))
    early = h.baseline("policy/entropy", 1, cfg.health.baseline_from - 1)
    if early > 0 and not base >= cfg.health.entropy_collapse_critical * early:
        base = early
    if not (base > 0 and now == now):
        return None
    if now < cfg.health.entropy_collapse_critical * base:
        severity = "critical"
    elif now < cfg.health.entropy_collapse_warn * base and reward_trend(h, cfg, 20) != "rising":
        severity = "warn"
    else:
        return None
    return _finding("entropy_collapse", severity, f"entropy {now:.3g} is {now / base:.0%} of its baseline {base:.3g}",
                    "raise algorithm.epsilon_high (0.28, clip-higher), add algorithm.entropy_coef, raise "
                    "rollout.temperature or lower optim.lr", ("algorithm.epsilon_high", "algorithm.entropy_coef",
                                                             "rollout.temperature", "optim.lr"), now / base)


@rule("entropy_blowup")
def entropy_blowup(h: History, cfg: Config) -> Finding | None:
    """W10 entropy far above its baseline and still rising: the policy is dissolving into noise."""
    base, window = _base(h, cfg, "policy/entropy"), h.last("policy/entropy", 10)
    now = nanmean(window)
    limit = max(cfg.health.entropy_blowup_factor * base, base + cfg.health.entropy_blowup_margin)
    if not (base == base and now > limit and change(window) > 0):
        return None
    severity = "critical" if reward_trend(h, cfg, 20) == "falling" else "warn"
    return _finding("entropy_blowup", severity, f"entropy {now:.3g} against a baseline of {base:.3g}, rising",
                    "lower optim.lr or algorithm.epsilon_high", ("optim.lr", "algorithm.epsilon_high"), now)


@rule("kl_blowup")
def kl_blowup(h: History, cfg: Config) -> Finding | None:
    """KL to the reference (beta > 0): high and rising, or a sudden spike."""
    if not (cfg.algorithm.beta > 0 and cfg.algorithm.kl_in == "loss"):
        return None
    hc, window = cfg.health, h.last("kl/mean", 10)
    now = nanmean(window)
    if now != now:
        return None
    advice = "raise algorithm.beta or lower optim.lr"
    keys = ("algorithm.beta", "optim.lr")
    if now > hc.kl_critical:
        return _finding("kl_blowup", "critical", f"mean KL over the last 10 steps is {now:.3g}", advice, keys, now)
    if now > hc.kl_warn and change(window) > 0:
        return _finding("kl_blowup", "warn", f"mean KL over the last 10 steps is {now:.3g} and rising", advice, keys, now)
    kl = h.last("kl/mean", 101)                                  # the last step and the W100 before it
    last = float(kl[-1])
    if last > hc.kl_spike_min and spike_flags(kl, hc.spike_mad, hc.spike_ratio, tail=1)[-1]:
        return _finding("kl_blowup", "warn", f"KL spiked to {last:.3g}", advice, keys, last)
    return None


@rule("truncation")
def truncation(h: History, cfg: Config) -> Finding | None:
    """Share of completions cut at rollout.max_new_tokens over W10."""
    share, severity = _windowed(h, "completion/truncated_frac", 10, cfg.health.truncation_warn,
                                cfg.health.truncation_critical)
    if severity is None:
        return None
    return _finding("truncation", severity, f"{share:.0%} of completions hit rollout.max_new_tokens "
                    f"({cfg.rollout.max_new_tokens}) over the last 10 steps",
                    "raise rollout.max_new_tokens, or set algorithm.overlong_filter / the soft_overlong reward",
                    ("rollout.max_new_tokens", "algorithm.overlong_filter", "reward.functions"), share)


@rule("length_inflation")
def length_inflation(h: History, cfg: Config) -> Finding | None:
    """Completions keep growing while the reward does not, or the reward follows length itself."""
    hc = cfg.health
    base, lengths = _base(h, cfg, "completion/length_mean"), h.last("completion/length_mean", 25)
    now = nanmean(lengths[-10:])
    growing = (base > 0 and now >= hc.length_inflation_factor * base and change(lengths) >= hc.length_growth * base
               and reward_trend(h, cfg, 25) != "rising")
    corr = nanmean(h.last("completion/length_reward_corr", 25))
    if not (growing or corr > hc.length_reward_corr):
        return None
    trunc = h.last("completion/truncated_frac", 25)
    severity = "critical" if change(trunc) > 0.05 and nanmean(trunc[-10:]) > hc.truncation_warn else "warn"
    why = (f"mean length {now:.1f} is {now / base:.1f}x its baseline and growing while the reward is not rising"
           if growing else f"length/reward correlation {corr:.2f} over the last 25 steps: the reward pays for length")
    return _finding("length_inflation", severity, why, "use algorithm.loss_agg_mode token-mean (dapo) or "
                    "seq-mean-token-sum-norm (dr_grpo), GFPO (algorithm.gfpo_filter.sample_size), or a length penalty "
                    "in reward.functions (cosine_length, soft_overlong); if longer answers are truly better "
                    "(worked solutions, tool calls), raise health.length_reward_corr",
                    ("algorithm.loss_agg_mode", "algorithm.gfpo_filter", "reward.functions"),
                    now / base if growing else corr)


@rule("length_collapse")
def length_collapse(h: History, cfg: Config) -> Finding | None:
    """Completions shrink to a fraction of their baseline while the reward rises: an empty-answer exploit?"""
    base, now = _base(h, cfg, "completion/length_mean"), nanmean(h.last("completion/length_mean", 10))
    if not (base > 0 and now <= cfg.health.length_collapse_factor * base and reward_trend(h, cfg, 25) == "rising"):
        return None
    return _finding("length_collapse", "warn", f"mean length {now:.1f} is {now / base:.0%} of its baseline "
                    f"{base:.1f} while the reward rises", "check for empty or degenerate answers the reward "
                    "functions accept (reward.functions); look at samples.jsonl", ("reward.functions",), now / base)


@rule("clip_saturation")
def clip_saturation(h: History, cfg: Config) -> Finding | None:
    """Share of tokens whose ratio was clipped over W10 (no gradient from them); info when clips are mostly low."""
    hc = cfg.health
    clip, severity = _windowed(h, "policy/clip_frac", 10, hc.clip_warn, hc.clip_critical)
    low, high = nanmean(h.last("policy/clip_low_frac", 10)), nanmean(h.last("policy/clip_high_frac", 10))
    skewed = low == low and high == high and low >= hc.clip_low_high_ratio * max(high, 1e-12)
    if severity is None and clip == clip and clip >= hc.clip_info and skewed:
        severity = "info"
    if severity is None:
        return None
    if h.has("flow/ratio_max_dev"):                            # a Flow-GRPO run: ratios per (image, denoising step)
        return _finding("clip_saturation", severity, f"{clip:.0%} of (image, step) ratios clipped over the last 10 "
                        "steps", "lower optim.lr or flow.updates_per_step, or raise flow.epsilon",
                        ("optim.lr", "flow.updates_per_step", "flow.epsilon"), clip)
    advice = "lower optim.lr or algorithm.num_iterations"
    if skewed:
        advice += "; most clips are at 1 - epsilon: raise algorithm.epsilon_high (clip-higher) so rare tokens can grow"
    return _finding("clip_saturation", severity, f"{clip:.0%} of tokens clipped over the last 10 steps "
                    f"(low {low:.0%}, high {high:.0%})", advice, ("optim.lr", "algorithm.num_iterations",
                                                                  "algorithm.epsilon_high"), clip)


@rule("grad_spike")
def grad_spike(h: History, cfg: Config) -> Finding | None:
    """The gradient norm (before clipping) far above its recent median; repeated spikes are critical."""
    grad = h.last("optim/grad_norm", 150)                       # W50, each step with the W100 before it
    flags = spike_flags(grad, cfg.health.spike_mad, cfg.health.spike_ratio, tail=50)
    count = int(flags[-50:].sum())
    if count >= cfg.health.grad_spike_critical:
        severity = "critical"
    elif flags.size and flags[-1]:
        severity = "warn"
    else:
        return None
    return _finding("grad_spike", severity, f"gradient norm {grad[-1]:.3g}; {count} spike(s) in the last 50 steps",
                    "lower optim.lr (and keep optim.max_grad_norm on)", ("optim.lr", "optim.max_grad_norm"), count)


@rule("format_gaming")
def format_gaming(h: History, cfg: Config) -> Finding | None:
    """An auxiliary reward rose to its maximum (it was below it at the baseline) while the main reward has gained
    nothing since its baseline: the run learned the easy reward, not the task. An auxiliary reward already at
    its maximum at the baseline (a policy that was taught the format) is not gaming."""
    names = h.reward_names()
    if len(names) < 2:
        return None
    hc, main = cfg.health, names[0]
    gain = nanmean(h.last(f"reward/{main}/mean", 30)) - _base(h, cfg, f"reward/{main}/mean")
    if not gain == gain or gain > hc.flat_reward:
        return None
    for aux in names[1:]:
        top = h.series(f"reward/{aux}/max")
        top = top if np.isfinite(top).any() else h.series(f"reward/{aux}/mean")
        peak = float(np.nanmax(top)) if np.isfinite(top).any() else float("nan")
        window = h.last(f"reward/{aux}/mean", 30)
        if not peak > 0 or window.size < 30 or _base(h, cfg, f"reward/{aux}/mean") >= hc.format_saturation * peak:
            continue
        share = float((window >= hc.format_saturation * peak).mean())
        if share >= hc.format_share:
            severity = "critical" if gain < -hc.flat_reward or reward_trend(h, cfg, 30) == "falling" else "warn"
            return _finding("format_gaming", severity, f"{aux} is at its maximum in {share:.0%} of the last 30 steps "
                            f"while {main} changed by {gain:+.2f} since its baseline",
                            f"gate {aux} on correctness or lower its weight in reward.weights",
                            ("reward.weights", "reward.functions"), share)
    return None


@rule("repetition")
def repetition(h: History, cfg: Config) -> Finding | None:
    """Share of completions stuck in a loop (a 4-gram repeated >= 8 times) over W10, against its baseline."""
    hc = cfg.health
    now = nanmean(h.last("completion/repetition_frac", 10))
    base = _base(h, cfg, "completion/repetition_frac")
    if not (now > hc.repetition_warn and now > hc.repetition_factor * (base if base == base else 0.0)):
        return None
    truncated = nanmean(h.last("completion/truncated_frac", 10)) > hc.truncation_warn
    return _finding("repetition", "critical" if truncated else "warn", f"{now:.0%} of completions repeat a 4-gram "
                    f"8+ times (baseline {base:.0%})", "add the repetition_penalty reward to reward.functions, "
                    "algorithm.entropy_coef, or a lower optim.lr", ("reward.functions", "algorithm.entropy_coef",
                                                                     "optim.lr"), now)


@rule("proxy_divergence")
def proxy_divergence(h: History, cfg: Config) -> Finding | None:
    """The training reward gains while the held-out score (train.eval_steps) does not: the verifier is being gamed."""
    main = main_reward(h)
    if main is None:
        return None
    evals = h.series(f"eval/reward/{main}")
    at = np.flatnonzero(np.isfinite(evals))
    if at.size < 2:
        return None
    train = h.series(f"reward/{main}/mean")
    trained = [nanmean(train[max(0, i - 9):i + 1]) for i in (at[0], at[-1])]   # W10 at each evaluation
    gap = (trained[1] - trained[0]) - (evals[at[-1]] - evals[at[0]])
    hc = cfg.health
    falling = evals[at[-1]] <= evals[at[0]] - hc.proxy_gap_warn
    severity = "critical" if gap >= hc.proxy_gap_critical or falling else "warn" if gap >= hc.proxy_gap_warn else None
    if severity is None:
        return None
    return _finding("proxy_divergence", severity, f"the training {main} gained {trained[1] - trained[0]:+.2f} since "
                    f"the first evaluation, the held-out score {evals[at[-1]] - evals[at[0]]:+.2f}",
                    "audit the verifier (reward.functions) on samples.jsonl: the policy may be exploiting it",
                    ("reward.functions",), gap)
