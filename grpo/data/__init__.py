"""Prompts and their sources: dataset files and in-memory rows (``datasets_io``), rendering,
tokenizing and the prompt stream (``prompts``), and the embedded tasks (``tasks``)."""


def __getattr__(name: str):
    """``from grpo.data import load_prompts`` (the flat layout's module) still works, with a warning."""
    import importlib
    import warnings

    prompts = importlib.import_module("grpo.data.prompts")
    if name.startswith("__") or not hasattr(prompts, name):
        raise AttributeError(f"module 'grpo.data' has no attribute {name!r}")
    warnings.warn(f"grpo.data.{name} moved to grpo.data.prompts.{name}", DeprecationWarning, stacklevel=2)
    return getattr(prompts, name)
