"""Tasks with a problem generator and a verifier (currently: arithmetic)."""

from grpo.data.tasks import arithmetic

#: Embedded tasks by name (`data.task`): each has generate(split, n, seed) and a verifier.
TASKS = {"arithmetic": arithmetic}

__all__ = ["TASKS", "arithmetic"]
