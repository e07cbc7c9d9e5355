"""The online side of the health rules: run them every step, report what is new or worse.

    record -> History -> every rule of grpo/health/rules.py (only non_finite before health.baseline_to)
           -> health/<rule> levels into the record (1 info, 2 warn, 3 critical, 0 quiet)
           -> a finding whose rule has not fired before, or fires now at a higher severity:
              a console line, a line of output_dir/alerts.jsonl, the callbacks' on_alert

`health.halt_on` names rules whose critical finding stops the run (the loop saves a checkpoint).
A resumed run reads the history back from metrics.jsonl and what was reported from alerts.jsonl (the
records of steps before the resumed one), so it reports exactly what an uninterrupted run would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grpo.config import Config, ConfigError
from grpo.health.history import SEVERITIES, Finding, History
from grpo.health.rules import EARLY_RULES, RULES
from grpo.state.metrics import ALERTS_FILE


def evaluate(history: History, cfg: Config) -> list[Finding]:
    """Every rule's finding on `history` as of its last step (the rules that may fire then), in registry order."""
    step = history.step
    found = []
    for name, fn in RULES.items():
        if step < cfg.health.baseline_to and name not in EARLY_RULES:
            continue
        finding = fn(history, cfg)
        if finding is not None:
            found.append(Finding(finding.rule, finding.severity, finding.message, finding.advice, finding.keys,
                                 step, finding.value))
    return found


def read_jsonl(path: Path, before: int | None = None) -> list[dict[str, Any]]:
    """The records of a JSONL file whose "step" is below `before` (all when None); a torn line is skipped."""
    out = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and (before is None or int(rec.get("step", 0)) < before):
            out.append(rec)
    return out


class HealthMonitor:
    """Runs the rules after every step of one run (rank 0 only; `enabled=False` makes every call a no-op)."""

    def __init__(self, cfg: Config, out: Path, first_step: int = 1, enabled: bool = True, echo: bool = True):
        unknown = [n for n in cfg.health.halt_on if n not in RULES]
        if unknown:
            raise ConfigError(f"health.halt_on: unknown rule {unknown[0]!r}; valid rules: {', '.join(RULES)}")
        self.cfg, self.path, self.echo = cfg, out / ALERTS_FILE, echo
        self.enabled = enabled and cfg.health.enabled
        self.history = History()
        self.reported: dict[str, int] = {}             # rule -> highest level reported so far
        self.halt: Finding | None = None
        if self.enabled and first_step > 1:           # a resumed run: what happened before the checkpoint
            self.history.extend(read_jsonl(out / cfg.log.metrics_file, before=first_step))
            for rec in read_jsonl(self.path, before=first_step):
                level = SEVERITIES.get(rec.get("severity"), 0)
                self.reported[rec["rule"]] = max(self.reported.get(rec["rule"], 0), level)

    def observe(self, record: dict[str, Any]) -> list[Finding]:
        """Add a step's record, put `health/<rule>` levels into it, return the new or worse findings."""
        if not self.enabled:
            return []
        self.history.append(record)
        found = evaluate(self.history, self.cfg)
        for name in RULES:
            record[f"health/{name}"] = 0.0
        new = []
        for f in found:
            record[f"health/{f.rule}"] = float(f.level)
            if f.level > self.reported.get(f.rule, 0):
                self.reported[f.rule] = f.level
                new.append(f)
                if f.severity == "critical" and f.rule in self.cfg.health.halt_on and self.halt is None:
                    self.halt = f
        record["health/alerts"] = float(len(new))
        return new

    def report(self, findings: list[Finding]) -> None:
        """Append `findings` to alerts.jsonl (flushed) and print their console lines."""
        if not findings:
            return
        with self.path.open("a") as fh:
            for f in findings:
                fh.write(json.dumps(f.to_json()) + "\n")
        if self.echo:
            from tqdm.auto import tqdm

            for f in findings:
                tqdm.write(f.line(), file=sys.stderr)
            if self.halt in findings:
                tqdm.write(f"health: stopping after this step: {self.halt.rule} is in health.halt_on", file=sys.stderr)
