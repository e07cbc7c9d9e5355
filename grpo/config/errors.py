"""The one error type of the configuration: every module of grpo/config raises it, so it sits below them all."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value or key; its message is one line that names the key."""
