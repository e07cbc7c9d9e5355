"""`grpo report RUN_DIR [RUN_DIR ...]`: a self-contained HTML report of one run, or several overlaid
(grpo/health/report.py)."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Write one HTML file (images inline; opens offline) with a run's curves (reward per function, accuracy,
held-out evaluation, length, truncation, entropy, KL, clip fraction, zero-spread groups, gradient norm,
step time split), its health alerts on a timeline (alerts.jsonl; re-checked by the rules when absent),
sample completions (samples.jsonl: the best and worst of a group), the config's differences from the
defaults and the timing breakdown. Several run directories: their curves are overlaid.
Default output: the first run's report.html.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="Write RUN_DIR/report.html: curves, alerts, samples, config (several runs: "
                                      "overlaid).", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="Output directories of grpo train / grpo demo.")
    p.add_argument("--out", help="Output HTML file (default: RUN_DIR/report.html of the first run).")
    p.add_argument("--sample-steps", dest="sample_steps", default="",
                   help="Comma-separated steps whose samples are shown (default: the first, middle and last).")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.health.report import write_report

    try:
        steps = [int(s) for s in args.sample_steps.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--sample-steps: expected comma-separated step numbers, got {args.sample_steps!r}") from None
    path = write_report(args.runs, args.out, steps)
    print(f"wrote {path}")
    return 0
