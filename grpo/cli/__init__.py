"""The command line (``grpo train | demo | eval | sft | export | rewards check | presets``): a thin
layer that turns strings into the objects of the Python API."""

from grpo.cli.main import main  # noqa: F401
