"""grpo: post-train language models with GRPO and its family of algorithms."""

__version__ = "0.1.0"
