"""Tasks with a problem generator and a verifier (currently: arithmetic)."""

from grpo.tasks import arithmetic

__all__ = ["arithmetic"]
