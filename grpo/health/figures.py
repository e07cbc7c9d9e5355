"""The report's figures (matplotlib, Agg), each returned as PNG bytes: one curve panel per metric group with
every run overlaid, the step-time split, and the alerts on a timeline."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Sequence

#: (title, y label, keys of one run's records -> the keys to draw). Several runs: every run's lines, one colour each.
PanelKeys = Callable[[list[str]], list[str]]


def _reward_keys(keys: list[str]) -> list[str]:
    return [k for k in keys if k.startswith("reward/") and k.endswith("/mean") and k != "reward/total/mean"]


def _main_reward(keys: list[str]) -> list[str]:
    return _reward_keys(keys)[:1]


PANELS: list[tuple[str, str, PanelKeys]] = [
    ("reward per function", "mean reward", _reward_keys),
    ("accuracy (main reward, training samples)", "mean", _main_reward),
    ("held-out evaluation (train.eval_steps)", "score", lambda ks: [k for k in ks if k.startswith("eval/")
                                                                     and not k.endswith("_length")]),
    ("completion length", "tokens", lambda ks: [k for k in ks if k == "completion/length_mean"]),
    ("truncated completions", "share", lambda ks: [k for k in ks if k == "completion/truncated_frac"]),
    ("entropy", "nats / token", lambda ks: [k for k in ks if k == "policy/entropy"]),
    ("KL to the reference", "k3 / token", lambda ks: [k for k in ks if k == "kl/mean"]),
    ("clipped tokens", "share", lambda ks: [k for k in ks if k in ("policy/clip_frac", "policy/clip_low_frac",
                                                                   "policy/clip_high_frac")]),
    ("groups with zero reward spread", "share", lambda ks: [k for k in ks if k == "advantages/zero_std_frac"]),
    ("gradient norm (before clipping)", "L2 norm", lambda ks: [k for k in ks if k == "optim/grad_norm"]),
]

COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]
SEVERITY_COLORS = {"info": "tab:blue", "warn": "tab:orange", "critical": "tab:red"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=80)
    _plt().close(fig)
    return buf.getvalue()


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over up to `window` values."""
    out, acc = [], []
    for v in values:
        acc = (acc + [v])[-window:]
        out.append(sum(acc) / len(acc))
    return out


def panel_grid(records: list[dict[str, Any]], panels: Sequence[tuple[str, str]], out_png: str | Path,
               window: int | None = None) -> Path:
    """A 2x2 figure of four `panels` ((metric key, title) each) of one run's metrics `records`, written to
    `out_png`: each key over the steps that have a value, as a faint line under its `window`-step moving average,
    or without `window` as the line itself (points marked on the sparse eval/ keys)."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts and window:
            steps, vals = zip(*pts)
            ax.plot(steps, vals, alpha=0.3, color="tab:blue")
            ax.plot(steps, smooth(vals, window), color="tab:blue")
        elif pts:
            ax.plot(*zip(*pts), marker="." if key.startswith("eval/") else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)


def points(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records with a number under `key`."""
    pts = [(r["step"], float(r[key])) for r in records if isinstance(r.get(key), (int, float))]
    return ([s for s, _ in pts], [v for _, v in pts]) if pts else ([], [])


def curve_panel(title: str, ylabel: str, runs: list[tuple[str, list[dict[str, Any]], list[str]]],
                window: int = 10) -> tuple[bytes | None, list[str]]:
    """One panel: every (run name, records, keys) drawn, raw faint and smoothed solid. Returns the PNG (None when
    nothing was drawn) and the labels of the lines drawn ("run: key" with several runs)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.2))
    drawn: list[str] = []
    styles = ["-", "--", ":", "-."]
    for r, (name, records, keys) in enumerate(runs):
        for j, key in enumerate(keys):
            steps, vals = points(records, key)
            if not steps:
                continue
            color = COLORS[r % len(COLORS)] if len(runs) > 1 else COLORS[j % len(COLORS)]
            label = (f"{name}: " if len(runs) > 1 else "") + key
            sparse = len(steps) < len(records) / 2                     # evaluations: markers, no smoothing
            if sparse:
                ax.plot(steps, vals, marker="o", color=color, linestyle=styles[j % 4], label=label)
            else:
                ax.plot(steps, vals, color=color, alpha=0.25, linestyle=styles[j % 4])
                ax.plot(steps, smooth(vals, window), color=color, linestyle=styles[j % 4], label=label)
            drawn.append(f"{name}: {key}")
    if not drawn:
        plt.close(fig)
        return None, []
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig), drawn


def time_split(runs: list[tuple[str, list[dict[str, Any]]]]) -> bytes | None:
    """Seconds per step: one run's sampling / scoring and log-probs / update stacked; several runs: step time lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.2))
    if len(runs) == 1:
        records = [r for r in runs[0][1] if all(isinstance(r.get(f"time/{k}"), (int, float))
                                                for k in ("rollout_s", "experience_s", "update_s"))]
        if not records:
            plt.close(fig)
            return None
        steps = [r["step"] for r in records]
        rollout = [r["time/rollout_s"] for r in records]
        scoring = [max(0.0, r["time/experience_s"] - r["time/rollout_s"]) for r in records]
        update = [r["time/update_s"] for r in records]
        ax.stackplot(steps, rollout, scoring, update, labels=["sampling", "rewards, ref / old log-probs", "update"],
                     alpha=0.8)
    else:
        for i, (name, records) in enumerate(runs):
            steps, vals = points(records, "time/step_s")
            ax.plot(steps, smooth(vals, 10), color=COLORS[i % len(COLORS)], label=f"{name}: time/step_s")
    ax.set_title("seconds per step", fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


def alert_timeline(runs: list[tuple[str, list[dict[str, Any]], int]]) -> bytes:
    """Every alert as a marker at its step on its rule's row (colour: severity; marker: run)."""
    plt = _plt()
    rules = sorted({a["rule"] for _, alerts, _ in runs for a in alerts})
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.35 * max(1, len(rules))))
    markers = ["o", "s", "^", "D", "v", "P"]
    last = max([steps for _, _, steps in runs] + [1])
    for i, (name, alerts, _) in enumerate(runs):
        for a in alerts:
            ax.scatter(a["step"], rules.index(a["rule"]), color=SEVERITY_COLORS.get(a["severity"], "black"),
                       marker=markers[i % len(markers)], s=60, label=name if len(runs) > 1 else None)
    ax.set_yticks(range(len(rules)), rules if rules else [])
    ax.set_xlim(0, last + 1)
    ax.set_ylim(-0.7, max(0.7, len(rules) - 0.3))
    ax.set_xlabel("step")
    ax.set_title("alerts (blue: info, orange: warn, red: critical)" if rules else "alerts: none", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    if len(runs) > 1 and rules:
        handles, labels = ax.get_legend_handles_labels()
        seen = dict(zip(labels, handles))
        ax.legend(seen.values(), seen.keys(), fontsize=7)
    return _png(fig)
