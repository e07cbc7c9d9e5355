"""grpo.cli.help_texts: `grpo rewards --help` lists every built-in reward of the registry (with the parameters of
those that take some), `grpo train --help` every algorithm preset."""

import pytest

from grpo.cli.help_texts import builtin_rewards_text, preset_names
from grpo.cli.main import main
from grpo.config.presets import PRESETS
from grpo.rewards.builtin import BUILTIN_REWARDS, REWARD_FACTORIES


def help_of(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


def test_rewards_help_lists_every_builtin_reward_and_the_parameters(capsys):
    out = help_of(["rewards", "--help"], capsys)
    listed = [line.strip().partition(":")[0] for line in out.split("describes each):\n")[1].splitlines()
              if line.startswith("  ")]
    assert listed == list(BUILTIN_REWARDS)
    assert "  cosine_length:max_len=1000,correct_at_0=1.0,correct_at_max=0.5,wrong_at_0=-0.5,wrong_at_max=0.0\n" in out
    assert "  accuracy\n" in out and "(e.g. cosine_length:max_len=1000)" in out
    assert out == help_of(["rewards", "-h"], capsys)
    assert builtin_rewards_text() in out


def test_the_listing_follows_the_registry(monkeypatch):
    monkeypatch.setitem(BUILTIN_REWARDS, "my_new_reward", lambda prompts, completions, **_: [0.0] * len(completions))
    assert "  my_new_reward\n" in builtin_rewards_text()
    assert set(REWARD_FACTORIES) <= set(BUILTIN_REWARDS)


def test_train_help_lists_every_preset(capsys):
    out = " ".join(help_of(["train", "--help"], capsys).split())      # argparse wraps the text
    assert len(PRESETS) == 20 and preset_names() == " | ".join(PRESETS)
    assert f"Algorithm preset: {preset_names()} (`grpo presets` shows each one's settings" in out
