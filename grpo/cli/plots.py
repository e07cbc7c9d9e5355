"""Training curves from metrics.jsonl (reward, accuracy, length, KL over steps)."""

from __future__ import annotations

from pathlib import Path

from grpo.state.metrics import read_metrics

PANELS = (("reward/total/mean", "total reward"), ("reward/accuracy/mean", "accuracy (train samples)"),
          ("completion/length_mean", "completion length (tokens)"), ("kl/mean", "KL to reference"))


def moving_average(values: list[float], window: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        acc = acc[-window:]
        out.append(sum(acc) / len(acc))
    return out


def plot_curves(metrics_path: str | Path, out_png: str | Path, window: int = 10,
                panels: tuple[tuple[str, str], ...] = PANELS) -> Path:
    """Write a 2x2 figure of the headline metrics (`panels`: (key, title) each); steps without a value are skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            steps, vals = zip(*pts)
            ax.plot(steps, vals, alpha=0.3, color="tab:blue")
            ax.plot(steps, moving_average(list(vals), window), color="tab:blue")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)
