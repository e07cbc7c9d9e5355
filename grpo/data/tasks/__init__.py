"""Tasks with a problem generator and a verifier (arithmetic, strings), and their own choices:
each task module names the rewards a run on it uses when none is given (``DEFAULT_REWARDS``)."""

from grpo.config import Config, ConfigError
from grpo.data.tasks import arithmetic, calculator, strings

#: Embedded tasks by name (`data.task`): each has generate(split, n, seed), a verifier and DEFAULT_REWARDS.
TASKS = {"arithmetic": arithmetic, "strings": strings, "calculator": calculator}


def task_module(name: str, key: str = "data.task"):
    """The embedded task `name`; a one-line ConfigError naming `key` (the flag or config key that chose it) and
    the known tasks otherwise."""
    if name not in TASKS:
        raise ConfigError(f"{key}: unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


def default_reward_functions(cfg: Config, dataset: str | None) -> list[str]:
    """The reward specs of a run that names none: the embedded task's own (`data.task`), or, on a user
    dataset (`dataset`: its path or description), a one-line ConfigError asking for one."""
    if dataset:
        raise ConfigError(f"no reward function for dataset {dataset}: pass --reward NAME (CLI), reward_funcs=[...] "
                          f"(Python) or reward.functions (config); built-ins: see `grpo rewards --help`")
    return list(task_module(cfg.data.task).DEFAULT_REWARDS)


__all__ = ["TASKS", "arithmetic", "calculator", "default_reward_functions", "strings", "task_module"]
