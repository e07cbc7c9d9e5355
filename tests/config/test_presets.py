import pytest

from grpo.cli.main import main
from grpo.config import ConfigError, build_config
from grpo.config.presets import PRESETS, format_presets, preset_values


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_a_valid_config_with_its_values(name):
    cfg = build_config(overrides={"algorithm.preset": name})
    for dotted, value in PRESETS[name].values.items():
        section, key = dotted.split(".")
        got = getattr(getattr(cfg, section), key)
        if isinstance(value, dict):              # a variant key: {name, parameters}, the others at their defaults
            got, value = {k: got.as_dict()[k] for k in value}, value
        assert got == value, dotted


def test_paper_settings():
    dapo = build_config(overrides={"algorithm.preset": "dapo"}).algorithm
    assert (dapo.beta, dapo.epsilon, dapo.epsilon_high, dapo.loss_agg_mode, dapo.dynamic_sampling) == \
        (0.0, 0.2, 0.28, "token-mean", True)
    grpo = build_config(overrides={"algorithm.preset": "grpo"}).algorithm
    assert (grpo.beta, grpo.epsilon, grpo.loss_agg_mode) == (0.04, 0.2, "seq-mean-token-mean")
    gspo = build_config(overrides={"algorithm.preset": "gspo"}).algorithm
    assert gspo.importance_sampling_level == "sequence"
    gfpo = build_config(overrides={"algorithm.preset": "gfpo"})
    assert gfpo.algorithm.gfpo_filter.params.sample_size > gfpo.rollout.num_generations


def test_explicit_options_override_a_preset_from_yaml_and_flags():
    cfg = build_config({"algorithm": {"preset": "dapo", "epsilon_high": 0.3}}, {"algorithm.beta": 0.01})
    assert (cfg.algorithm.epsilon_high, cfg.algorithm.beta, cfg.algorithm.loss_agg_mode) == (0.3, 0.01, "token-mean")
    # the flag wins over the YAML file's preset
    cfg = build_config({"algorithm": {"preset": "dapo"}}, {"algorithm.preset": "gspo"})
    assert cfg.algorithm.importance_sampling_level == "sequence" and cfg.algorithm.loss_agg_mode != "token-mean"


def test_unknown_preset_is_a_one_line_error():
    with pytest.raises(ConfigError, match="unknown algorithm preset 'ppo'; choose from grpo, dapo"):
        preset_values("ppo")
    assert main(["train", "--algorithm", "ppo", "--max-steps", "0"]) == 2


def test_presets_command_prints_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert out == format_presets()
    for name, p in PRESETS.items():
        assert f"{name}: {p.summary}" in out and p.paper in out
    assert "algorithm.epsilon_high                   0.28" in out


def test_the_preset_key_help_names_every_preset():
    import re

    from grpo.config import field_help

    text = next(h for key, _, h in field_help() if key == "algorithm.preset")
    assert set(PRESETS) <= set(re.findall(r"[a-z0-9_]+", text))
