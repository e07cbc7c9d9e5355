"""Help texts generated from the registries, so that `--help` lists what the code has: the built-in rewards
(`grpo rewards --help`), the algorithm presets (`grpo train --help`'s --algorithm). The rewards are imported
only when their help is asked for (grpo.rewards pulls in torch)."""

from __future__ import annotations

import argparse
import inspect


def preset_names() -> str:
    """Every algorithm preset's name, as `grpo presets` prints them: 'grpo | dapo | ...'."""
    from grpo.config.presets import PRESETS

    return " | ".join(PRESETS)


def builtin_rewards_text() -> str:
    """The built-in reward names of grpo.rewards.builtin's registry, those with parameters as NAME:key=default,..."""
    from grpo.rewards.builtin import BUILTIN_REWARDS, REWARD_FACTORIES

    lines = ["built-in rewards (a name for --reward, reward.functions or reward_funcs=[...]; docs/rewards.md "
             "describes each):"]
    for name in BUILTIN_REWARDS:
        factory = REWARD_FACTORIES.get(name)
        params = "" if factory is None else ":" + ",".join(
            f"{p.name}={p.default}" for p in inspect.signature(factory).parameters.values())
        lines.append(f"  {name}{params}")
    if REWARD_FACTORIES:
        name, factory = next(iter(REWARD_FACTORIES.items()))
        first = next(iter(inspect.signature(factory).parameters.values()))
        lines.append("A reward shown with parameters takes NAME alone (the defaults shown) or NAME:key=value,... "
                     f"(e.g. {name}:{first.name}={first.default}).")
    lines.append("Other rewards: path/to/file.py:function, package.module.function or a reward-model directory.")
    return "\n".join(lines) + "\n"


class _RewardsHelp(argparse.Action):
    """-h / --help of `grpo rewards`: its help with the built-in rewards as the epilog."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.epilog = builtin_rewards_text()
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.print_help()
        parser.exit()


def add_rewards_help(parser: argparse.ArgumentParser) -> None:
    """Give `parser` (made with add_help=False) a -h / --help that lists the built-in rewards."""
    parser.add_argument("-h", "--help", action=_RewardsHelp, nargs=0,
                        help="show this help message (with the built-in reward names) and exit")
