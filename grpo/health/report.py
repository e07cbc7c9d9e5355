"""`grpo report RUN_DIR [RUN_DIR ...]`: one self-contained HTML file (images inline, no network) per call.

It reads what a run writes: metrics.jsonl (curves, timings), alerts.jsonl (the health findings; a run
without one, e.g. from an older version, is checked by the rules afresh), samples.jsonl (best and worst
completions of a group per step, `log.samples_per_step`), config.yaml (the differences from the
defaults) and summary.json (a demo's before/after table). With several runs the curves are overlaid.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo.config import Config, build_config, to_dict
from grpo.config.variants import nested_saved
from grpo.health.figures import PANELS, alert_timeline, curve_panel, time_split
from grpo.health.monitor import HealthMonitor
from grpo.state.metrics import ALERTS_FILE
from grpo.state.resume_config import flat_config
from grpo.state.samples import SAMPLES_FILE

REPORT_FILE = "report.html"


class ReportError(ValueError):
    """A run directory the report cannot read; the message names the file."""


@dataclass
class Run:
    name: str
    path: Path
    records: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    samples: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None

    @property
    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.records:
            seen.update(dict.fromkeys(r))
        return list(seen)


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ReportError(f"{path}: not valid JSON ({e})") from None


def _replayed_alerts(records: list[dict[str, Any]], config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What the online monitor would have written, for a run without alerts.jsonl."""
    try:
        cfg = build_config(nested_saved(config or {}))      # a run saved with flat variant keys: quietly nested
    except ValueError:
        cfg = Config()
    found = []
    monitor = HealthMonitor(cfg, Path("."), echo=False)
    for rec in records:
        found += [f.to_json() for f in monitor.observe(dict(rec))]
    return found


#: Keys every record of a run file needs for the report (samples: what the samples table shows).
NEEDED = {"metrics": ("step",), "alerts": ("step", "severity", "rule"),
          "samples": ("step", "group", "kind", "prompt", "completion")}


def read_records(path: Path, kind: str) -> list[dict[str, Any]]:
    """The JSON-object lines of a run file (blank lines and an unterminated torn last line, a run writing
    now, are passed over); any other line that is not an object with NEEDED[kind] and an integer step is
    a ReportError naming the file and line."""
    text = path.read_text()
    lines = text.split("\n")
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if n == len(lines):                    # no newline after it: a record being written
                break
            raise ReportError(f"{path}:{n}: not valid JSON") from None
        if not isinstance(rec, dict):
            raise ReportError(f"{path}:{n}: a record must be a JSON object, got {type(rec).__name__}")
        missing = [k for k in NEEDED[kind] if k not in rec]
        if missing:
            raise ReportError(f"{path}:{n}: a {kind} record without {', '.join(repr(k) for k in missing)}")
        if isinstance(rec["step"], bool) or not isinstance(rec["step"], int):
            raise ReportError(f"{path}:{n}: 'step' must be an integer, got {rec['step']!r}")
        out.append(rec)
    return out


def load_run(path: str | Path) -> Run:
    """A run directory's files; a missing directory or metrics file is a ReportError naming it."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path}: not a run directory")
    config = None
    if (path / "config.yaml").is_file():
        config = yaml.safe_load((path / "config.yaml").read_text())
    metrics_name = (config or {}).get("log", {}).get("metrics_file", "metrics.jsonl")
    metrics = path / metrics_name
    if not metrics.is_file():
        raise ReportError(f"{metrics}: no such file (is {path} a grpo run directory?)")
    records = read_records(metrics, "metrics")
    alerts = (read_records(path / ALERTS_FILE, "alerts") if (path / ALERTS_FILE).is_file()
              else _replayed_alerts(records, config))
    summary = _json_file(path / "summary.json") if (path / "summary.json").is_file() else None
    samples = read_records(path / SAMPLES_FILE, "samples") if (path / SAMPLES_FILE).is_file() else []
    return Run(path.name or str(path), path, records, alerts, samples, config, summary)


def _img(png: bytes | None, alt: str, lines: list[str] | None = None) -> str:
    """An inline PNG; `lines` (the series drawn) go into its title."""
    if png is None:
        return ""
    title = f' title="{html.escape("; ".join(lines))}"' if lines else ""
    return f'<img alt="{html.escape(alt)}"{title} src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else html.escape(json.dumps(v) if isinstance(v, (list, dict)) else str(v))


def config_diff(config: dict[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """(key, default, value) of every config key the run set away from its default."""
    if not config:
        return []
    defaults, given = flat_config(to_dict(Config())), flat_config(config)
    return [(k, defaults.get(k), v) for k, v in given.items() if defaults.get(k) != v]


def timing(records: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(stage, mean seconds per step, share of the step) over the run's steps."""
    def mean(key: str) -> float:
        vals = [r[key] for r in records if isinstance(r.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else float("nan")

    step, rollout, exp, upd = (mean(f"time/{k}") for k in ("step_s", "rollout_s", "experience_s", "update_s"))
    rows = [("sampling (rollout)", rollout), ("rewards, reference and old log-probs", exp - rollout),
            ("policy update", upd), ("step", step)]
    return [(name, s, s / step if step else float("nan")) for name, s in rows]


def pick_steps(samples: list[dict[str, Any]], wanted: list[int] | None) -> list[int]:
    """The steps whose samples are shown: `wanted` (those present), else the first, middle and last."""
    steps = sorted({s["step"] for s in samples})
    if wanted:
        return [s for s in wanted if s in steps]
    return sorted({steps[0], steps[len(steps) // 2], steps[-1]}) if steps else []


def _text(value: Any) -> str:
    """A prompt or completion as text (chat messages as JSON)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _samples_html(run: Run, steps: list[int]) -> str:
    parts = []
    for step in pick_steps(run.samples, steps):
        rows = [[s["group"], s["kind"], f"<pre>{html.escape(_text(s['prompt']))}</pre>", f"<pre>{html.escape(_text(s['completion']))}</pre>",
                 _fmt(s.get("total")), _fmt(s.get("rewards")), _fmt(s.get("advantage"))]
                for s in run.samples if s["step"] == step]
        parts.append(f"<h4>{html.escape(run.name)}, step {step}</h4>" + _table(
            ["group", "kind", "prompt", "completion", "total", "rewards", "advantage"], rows))
    return "".join(parts) or "<p>No samples.jsonl (log.samples_per_step: 0, or an older run).</p>"


STYLE = """body{font-family:sans-serif;margin:24px;color:#222}h1{font-size:22px}h2{margin-top:28px;font-size:18px;
border-bottom:1px solid #ccc}table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ccc;
padding:3px 6px;vertical-align:top;text-align:left}pre{margin:0;white-space:pre-wrap;max-width:520px}
.grid{display:flex;flex-wrap:wrap;gap:6px}.critical{color:#b00;font-weight:bold}.warn{color:#c60}.info{color:#06c}"""

# Marks the page once every image has decoded (the headless-browser test reads data-images-ok).
SCRIPT = """window.addEventListener('load', function () { var imgs = Array.prototype.slice.call(document.images);
var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
document.body.setAttribute('data-images-ok', ok + '/' + imgs.length); });"""


def render(runs: list[Run], sample_steps: list[int] | None = None) -> str:
    """The report of `runs` as one HTML document."""
    title = "grpo report: " + ", ".join(r.name for r in runs)
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{STYLE}</style><script>{SCRIPT}</script></head><body><h1>{html.escape(title)}</h1>"]
    rows = []
    for r in runs:
        last = r.records[-1] if r.records else {}
        counts = {s: sum(a["severity"] == s for a in r.alerts) for s in ("critical", "warn", "info")}
        rows.append([html.escape(str(r.path)), last.get("step", 0), _fmt(last.get("reward/total/mean")),
                     ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none"])
    out.append(_table(["run", "steps", "last total reward", "alerts"], rows))
    for r in runs:
        if r.summary and isinstance(r.summary.get("before"), dict) and isinstance(r.summary.get("after"), dict):
            out.append(f"<h4>{html.escape(r.name)}: held-out before / after</h4>" + _table(
                ["metric", "before", "after"], [[html.escape(k), _fmt(v), _fmt(r.summary["after"].get(k))]
                                                for k, v in r.summary["before"].items()]))
    out.append("<h2>Alerts</h2>" + _img(alert_timeline([(r.name, r.alerts, len(r.records)) for r in runs]), "alerts"))
    alert_rows = [[html.escape(r.name), a["step"], f"<span class='{a['severity']}'>{a['severity']}</span>",
                   html.escape(a["rule"]), html.escape(a.get("message", "")), html.escape(a.get("advice", ""))]
                  for r in runs for a in r.alerts]
    out.append(_table(["run", "step", "severity", "rule", "finding", "advice"], alert_rows) if alert_rows
               else "<p>No alerts: every health rule stayed silent (docs/health.md).</p>")
    out.append("<h2>Curves</h2><div class='grid'>")
    for ptitle, ylabel, keys in PANELS:
        png, lines = curve_panel(ptitle, ylabel, [(r.name, r.records, keys(r.keys)) for r in runs])
        out.append(_img(png, ptitle, lines))
    out.append(_img(time_split([(r.name, r.records) for r in runs]), "seconds per step") + "</div>")
    out.append("<h2>Timing (mean seconds per step)</h2>")
    for r in runs:
        out.append(f"<h4>{html.escape(r.name)}</h4>" + _table(["stage", "seconds", "share"], [
            [name, _fmt(s), f"{share:.0%}" if share == share else "-"] for name, s, share in timing(r.records)]))
    out.append("<h2>Sample completions (best and worst of a group)</h2>")
    out += [_samples_html(r, sample_steps or []) for r in runs]
    out.append("<h2>Configuration: differences from the defaults</h2>")
    for r in runs:
        diff = config_diff(r.config)
        out.append(f"<h4>{html.escape(r.name)}</h4>" + (_table(["key", "default", "this run"], [
            [html.escape(k), _fmt(d), _fmt(v)] for k, d, v in diff]) if diff else "<p>Defaults only (or no config.yaml).</p>"))
    out.append("</body></html>")
    return "\n".join(out)


def write_report(run_dirs: list[str | Path], out: str | Path | None = None,
                 sample_steps: list[int] | None = None) -> Path:
    """Write the report of `run_dirs` to `out` (default: the first run's report.html); returns its path."""
    if not run_dirs:
        raise ReportError("grpo report: name at least one run directory")
    runs = [load_run(d) for d in run_dirs]
    if len({r.name for r in runs}) < len(runs):                   # a/run and b/run: tell them apart
        for r in runs:
            r.name = str(r.path)
    shown = {s["step"] for r in runs for s in r.samples}
    absent = [s for s in sample_steps or [] if s not in shown]
    if absent:
        raise ReportError(f"--sample-steps: no samples of step {', '.join(map(str, absent))} in "
                          f"{', '.join(str(r.path / SAMPLES_FILE) for r in runs)} (steps with samples: "
                          f"{', '.join(map(str, sorted(shown))) or 'none'})")
    path = Path(out) if out else runs[0].path / REPORT_FILE
    if path.is_dir():
        raise ReportError(f"--out {path} is a directory: name the HTML file to write")
    if not path.parent.is_dir():
        raise ReportError(f"--out {path}: {path.parent} is not a directory")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(render(runs, sample_steps))
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"--out {path}: cannot write it ({e.strerror or e})") from None
    return path

