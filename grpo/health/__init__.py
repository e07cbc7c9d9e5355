"""Run health: online rules for GRPO's known failure modes (rules.py, monitor.py) and the HTML report
of one or several runs (report.py). docs/health.md describes every rule and its thresholds."""

from grpo.health.history import Finding, History
from grpo.health.monitor import ALERTS_FILE, HealthMonitor, evaluate
from grpo.health.rules import RULES

__all__ = ["ALERTS_FILE", "Finding", "HealthMonitor", "History", "RULES", "evaluate"]
