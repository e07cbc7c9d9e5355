"""Variant keys as a registry entry with its own parameters (grpo/config/variants.py): the nested form in YAML,
on the command line and in presets, the flat keys of earlier versions as aliases, and runs saved with them."""

from dataclasses import replace
from pathlib import Path

import pytest

from grpo.api.inputs import resolve_config
from grpo.cli.common import resolve_given
from grpo.config import ConfigError, build_config, field_help, load_yaml, to_dict, valid_keys
from grpo.config.trl import from_trl
from grpo.config.variants import FLAT_ALIASES, REGISTRIES
from grpo.state.resume import config_changes
from grpo.state.resume_config import flat_config, refused_change


def test_nested_yaml_sets_the_entry_and_its_parameters(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n"
                    "  policy_loss: {name: sapo, tau_pos: 1.2}\n"
                    "  token_preference:\n    name: lambda\n    lr: 0.05\n"
                    "  rollout_correction: token_mask\n")
    algo = build_config(load_yaml(path)).algorithm
    assert algo.policy_loss.as_dict() == {"name": "sapo", "tau_pos": 1.2, "tau_neg": 1.05}   # tau_neg: its default
    assert (algo.token_preference.params.init, algo.token_preference.params.r, algo.token_preference.params.lr) == \
        (0.0, 0.5, 0.05)
    assert algo.rollout_correction.as_dict() == {"name": "token_mask", "min": None, "max": 3.0}   # a plain name
    assert algo.policy_loss == "sapo" and algo.critic == "none"                  # a Variant compares to its name


def test_nested_cli_overrides_the_yaml_and_the_preset(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  preset: sapo\n  policy_loss: {tau_neg: 1.3}\n")
    cfg = resolve_given(str(path), ["--algorithm.policy_loss.tau_pos", "0.9"], {})
    assert cfg.algorithm.policy_loss.as_dict() == {"name": "sapo", "tau_pos": 0.9, "tau_neg": 1.3}
    assert cfg.algorithm.beta == 0.0                                                    # the preset's
    # another entry drops the old one's parameters; its own given before its name in the same layer still count
    cfg = resolve_given(str(path), ["--algorithm.policy_loss.k_pos", "1.5", "--algorithm.policy_loss", "vespo"], {})
    assert cfg.algorithm.policy_loss.as_dict() == {"name": "vespo", "k_pos": 1.5, "lambda_pos": 3.0, "k_neg": 3.0,
                                                   "lambda_neg": 2.0}
    cfg = resolve_given(None, ["--algorithm.gfpo_filter", "{name: token_efficiency, sample_size: 12}"], {})
    assert (cfg.algorithm.gfpo_filter.name, cfg.algorithm.gfpo_filter.params.sample_size) == ("token_efficiency", 12)


def test_flat_alias_maps_into_the_nested_value_and_prints_the_new_spelling(capsys, monkeypatch):
    monkeypatch.setattr("grpo.config.aliases.PRINTED", set())            # each pointer is printed once per process
    algo = build_config({"algorithm": {"policy_loss": "sapo", "sapo_tau_pos": 1.2}},
                        {"algorithm.lambda_lr": 0.05, "algorithm.token_preference": "lambda"}).algorithm
    assert algo.policy_loss.as_dict() == {"name": "sapo", "tau_pos": 1.2, "tau_neg": 1.05}
    assert algo.token_preference.params.lr == 0.05
    assert capsys.readouterr().err.splitlines() == ["grpo: algorithm.sapo_tau_pos is now algorithm.policy_loss.tau_pos",
                                                    "grpo: algorithm.lambda_lr is now algorithm.token_preference.lr"]
    build_config(overrides={"algorithm.sapo_tau_pos": 1.2})
    assert capsys.readouterr().err == ""                                     # said once already
    # a flat key of another entry changes nothing, as it did when it was a key of its own
    assert build_config(overrides={"algorithm.vespo_k_pos": 9.0}).algorithm.policy_loss.as_dict() == \
        {"name": "clip", "ratio_c": None, "delta": None}
    # the later layer wins, whichever spelling each uses
    assert build_config({"algorithm": {"policy_loss": {"name": "sapo", "tau_pos": 1.2}}},
                        {"algorithm.sapo_tau_pos": 0.7}).algorithm.policy_loss.params.tau_pos == 0.7
    assert build_config({"algorithm": {"policy_loss": "sapo", "sapo_tau_pos": 0.7}},
                        {"algorithm.policy_loss.tau_pos": 1.2}).algorithm.policy_loss.params.tau_pos == 1.2


def test_every_flat_alias_lands_on_a_parameter_its_registry_declares():
    for old, (key, param) in FLAT_ALIASES.items():
        declared = {p for cls in REGISTRIES[key].values() for p in cls.__dataclass_fields__}
        assert param is None or param in declared, old


def test_unknown_parameter_is_a_one_line_error_naming_the_key_and_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"^unknown parameter 'algorithm.policy_loss.tau': algorithm.policy_loss "
                                          r"sapo takes tau_pos, tau_neg$"):
        build_config({"algorithm": {"policy_loss": {"name": "sapo", "tau": 1.2}}})
    with pytest.raises(ConfigError, match="algorithm.critic none takes none"):
        build_config(overrides={"algorithm.critic.alpha": 0.5})
    with pytest.raises(ConfigError, match=r"algorithm.critic must be one of \['none', 'value_head'\], got 'mlp'"):
        build_config(overrides={"algorithm.critic": "mlp"})
    with pytest.raises(ConfigError, match="config key 'algorithm.policy_loss.tau_pos' expects a number"):
        build_config(overrides={"algorithm.policy_loss": "sapo", "algorithm.policy_loss.tau_pos": "warm"})


@pytest.mark.parametrize("preset, flat", [
    ("sapo", {"algorithm.policy_loss": "sapo", "algorithm.sapo_tau_pos": 1.0, "algorithm.sapo_tau_neg": 1.05,
              "algorithm.beta": 0.0}),
    ("grpo_lead", {"rollout.num_generations": 8, "algorithm.beta": 0.0, "algorithm.length_reward_alpha": 0.05,
                   "algorithm.wrong_answer_penalty": 1.0, "algorithm.difficulty_weighting": "lead",
                   "algorithm.difficulty_weight_min": 0.4, "algorithm.difficulty_weight_max": 1.5,
                   "algorithm.difficulty_midpoint": 0.75, "algorithm.difficulty_steepness": 10.0}),
    ("gfpo", {"rollout.num_generations": 8, "algorithm.gfpo_sample_size": 16, "algorithm.gfpo_metric": "token_efficiency"}),
    ("hybrid_grpo", {"algorithm.critic": "value_head", "algorithm.hybrid_alpha": 0.5}),
    ("dr_grpo", {"algorithm.advantage_estimator": "dr_grpo", "algorithm.scale_rewards": "none", "algorithm.beta": 0.0,
                 "algorithm.loss_agg_mode": "seq-mean-token-sum-norm"}),
    ("rloo", {"algorithm.advantage_estimator": "rloo", "algorithm.scale_rewards": "none", "algorithm.kl_in": "reward",
              "algorithm.kl_estimator": "k1", "algorithm.beta": 0.05}),
    ("reinforce_pp", {"algorithm.advantage_estimator": "reinforce_pp", "algorithm.kl_in": "reward",
                      "algorithm.kl_estimator": "k1", "algorithm.beta": 0.01, "algorithm.loss_agg_mode": "token-mean"}),
    ("dsv32", {"algorithm.scale_rewards": "none", "algorithm.kl_ratio_correction": True,
               "algorithm.off_policy_mask_threshold": 0.5}),
    ("vespo", {"algorithm.policy_loss": "vespo", "algorithm.beta": 0.0, "algorithm.loss_agg_mode": "token-mean",
               "algorithm.vespo_k_pos": 2.0, "algorithm.vespo_lambda_pos": 3.0, "algorithm.vespo_k_neg": 3.0,
               "algorithm.vespo_lambda_neg": 2.0}),
])
def test_a_nested_preset_equals_its_earlier_flat_settings(preset, flat):
    nested = build_config(overrides={"algorithm.preset": preset})
    assert nested.algorithm.preset == preset
    assert replace(nested, algorithm=replace(nested.algorithm, preset=None)) == build_config(overrides=flat)


def test_trl_keys_of_other_entries_are_quiet_and_change_nothing(capsys):
    cfg = resolve_config({"loss_type": "grpo", "sapo_temperature_pos": 0.9, "delta": 4.0, "entropy_target": 1.5})
    assert cfg.algorithm.policy_loss.as_dict() == {"name": "clip", "ratio_c": None, "delta": 4.0}
    assert cfg.algorithm.entropy_control.as_dict() == {"name": "fixed"}
    assert "is now" not in capsys.readouterr().err
    sapo = resolve_config({"loss_type": "sapo", "sapo_temperature_pos": 0.9}).algorithm.policy_loss
    assert sapo.as_dict() == {"name": "sapo", "tau_pos": 0.9, "tau_neg": 1.05}


#: An algorithm section as runs saved before the nested keys wrote it (every flat key, sapo with tau_pos 1.2).
OLD_FLAT = {
    "policy_loss": "sapo", "clip_ratio_c": None, "clip_delta": None, "cispo_max": 5.0, "sapo_tau_pos": 1.2,
    "sapo_tau_neg": 1.05, "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0,
    "entropy_control": "fixed", "entropy_target": 0.2, "entropy_coef_delta": 0.005, "entropy_coef_min": 0.0,
    "entropy_coef_max": 1.0, "gfpo_sample_size": 0, "gfpo_metric": "length", "rollout_correction": "none",
    "rollout_correction_min": None, "rollout_correction_max": 3.0, "token_preference": "lambda", "lambda_init": 0.0,
    "lambda_r": 0.5, "lambda_lr": 0.05, "critic": "none", "hybrid_alpha": 0.5, "value_lr": 0.001, "value_steps": 1,
    "difficulty_weighting": "none", "difficulty_weight_min": 0.4, "difficulty_weight_max": 1.5,
    "difficulty_midpoint": 0.75, "difficulty_steepness": 10.0, "entropy_advantage": "none",
    "entropy_reward_weight": 0.1, "advantage_estimator": "grpo", "advantage_eps": 1e-4, "scale_rewards": "group",
    "off_policy_mask_threshold": None, "off_policy_mask_measure": "kl",
}


def test_a_run_saved_with_flat_keys_compares_equal_and_resumes(capsys):
    cfg = build_config({"algorithm": {"policy_loss": {"name": "sapo", "tau_pos": 1.2},
                                      "token_preference": {"name": "lambda", "lr": 0.05}}})
    saved = to_dict(cfg)
    saved["algorithm"] = {**{k: v for k, v in saved["algorithm"].items() if k not in REGISTRIES}, **OLD_FLAT}
    assert flat_config(saved) == flat_config(to_dict(cfg))
    assert config_changes(saved, cfg) == []
    assert refused_change(saved, cfg, Path("checkpoint-3")) is None
    assert capsys.readouterr().err == ""                                   # a saved config is upgraded quietly
    # a real change is still one, named by the variant key
    changed = build_config({"algorithm": {"policy_loss": {"name": "sapo", "tau_pos": 1.0},
                                          "token_preference": {"name": "lambda", "lr": 0.05}}})
    assert config_changes(saved, changed) == [
        "algorithm.policy_loss: {'name': 'sapo', 'tau_pos': 1.2, 'tau_neg': 1.05} -> "
        "{'name': 'sapo', 'tau_pos': 1.0, 'tau_neg': 1.05}"]
    assert build_config(saved) == cfg                                      # and it still builds (with pointers)


def test_help_lists_each_parameter_with_its_entries():
    rows = {key: (default, text) for key, default, text in field_help()}
    assert rows["algorithm.policy_loss"][0] == "clip"
    assert rows["algorithm.policy_loss.tau_pos"] == (1.0, "(sapo) Gate temperature for A > 0.")
    assert rows["algorithm.rollout_correction.max"][1].startswith(
        "(token_truncate, token_mask, sequence_truncate, sequence_mask) Upper bound")
    assert "algorithm.entropy_control.coef_max" in valid_keys() and "algorithm.sapo_tau_pos" not in valid_keys()


def test_renamed_keys_helper_rewrites_flat_and_nested_dicts(capsys, monkeypatch):
    from grpo.config import aliases

    monkeypatch.setattr(aliases, "RENAMED", {"train.num_threads": "cpu.num_threads"})
    monkeypatch.setattr(aliases, "PRINTED", set())
    assert aliases.rewrite({"train.num_threads": 4, "optim.lr": 1e-6}) == {"cpu.num_threads": 4, "optim.lr": 1e-6}
    assert aliases.rewrite_tree({"train": {"num_threads": 4, "seed": 1}}, quiet=True) == \
        {"cpu": {"num_threads": 4}, "train": {"seed": 1}}
    assert capsys.readouterr().err == "grpo: train.num_threads is now cpu.num_threads\n"


# ---------------------------------------------------------------- algorithm.advantage (the advantage estimator)


def test_advantage_nested_in_yaml_and_on_the_command_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  advantage: {name: grpo, eps: 1.0e-6, scale_rewards: batch}\n")
    algo = build_config(load_yaml(path)).algorithm
    assert algo.advantage.as_dict() == {"name": "grpo", "eps": 1e-6, "scale_rewards": "batch"}
    cfg = resolve_given(str(path), ["--algorithm.advantage.scale_rewards", "none"], {})
    assert cfg.algorithm.advantage.as_dict() == {"name": "grpo", "eps": 1e-6, "scale_rewards": "none"}
    cfg = resolve_given(str(path), ["--algorithm.advantage", "rloo"], {})             # another entry: its defaults
    assert cfg.algorithm.advantage.as_dict() == {"name": "rloo", "eps": 1e-4}
    assert build_config().algorithm.advantage.as_dict() == {"name": "grpo", "eps": 1e-4, "scale_rewards": "group"}
    assert build_config(overrides={"algorithm.advantage": "reinforce_pp"}).algorithm.advantage == "reinforce_pp"


def test_advantage_flat_aliases_print_the_new_spelling(capsys, monkeypatch):
    monkeypatch.setattr("grpo.config.aliases.PRINTED", set())
    algo = build_config({"algorithm": {"advantage_estimator": "grpo", "advantage_eps": 1e-5,
                                       "scale_rewards": "none"}}).algorithm
    assert algo.advantage.as_dict() == {"name": "grpo", "eps": 1e-5, "scale_rewards": "none"}
    assert capsys.readouterr().err.splitlines() == [
        "grpo: algorithm.advantage_estimator is now algorithm.advantage",
        "grpo: algorithm.advantage_eps is now algorithm.advantage.eps",
        "grpo: algorithm.scale_rewards is now algorithm.advantage.scale_rewards"]
    # scale_rewards is grpo's alone: under rloo it changes nothing, as rloo never read it
    assert build_config(overrides={"algorithm.advantage_estimator": "rloo", "algorithm.scale_rewards": "batch",
                                   "algorithm.advantage_eps": 1e-3}).algorithm.advantage.as_dict() == \
        {"name": "rloo", "eps": 1e-3}


def test_advantage_unknown_parameter_and_bad_values_name_the_key():
    with pytest.raises(ConfigError, match=r"^unknown parameter 'algorithm.advantage.scale_rewards': "
                                          r"algorithm.advantage dr_grpo takes eps$"):
        build_config({"algorithm": {"advantage": {"name": "dr_grpo", "scale_rewards": "batch"}}})
    with pytest.raises(ConfigError, match=r"algorithm.advantage must be one of \['dr_grpo', 'grpo', 'reinforce_pp', "
                                          r"'rloo'\], got 'gae'"):
        build_config(overrides={"algorithm.advantage_estimator": "gae"})
    with pytest.raises(ConfigError, match=r"^algorithm.advantage.scale_rewards must be one of \['batch', 'group', "
                                          r"'none'\], got 'token' \(grpo\)$"):
        build_config(overrides={"algorithm.scale_rewards": "token"})
    with pytest.raises(ConfigError, match=r"^algorithm.advantage.eps must be >= 0 \(rloo\)$"):
        build_config(overrides={"algorithm.advantage": {"name": "rloo", "eps": -1.0}})
    with pytest.raises(ConfigError, match="algorithm.critic value_head replaces the advantage estimator"):
        build_config(overrides={"algorithm.preset": "rloo", "algorithm.critic": "value_head"})


def test_advantage_registry_and_parameter_table_list_the_same_entries():
    from grpo.algorithms.advantages import ADVANTAGE_ESTIMATORS, ADVANTAGE_PARAMS

    assert list(ADVANTAGE_PARAMS) == list(ADVANTAGE_ESTIMATORS)
    rows = {key: (default, text) for key, default, text in field_help()}
    assert rows["algorithm.advantage"][0] == "grpo"
    assert rows["algorithm.advantage.scale_rewards"][0] == "group"
    assert rows["algorithm.advantage.scale_rewards"][1].startswith("(grpo) The std A is divided by")
    assert rows["algorithm.advantage.eps"][0] == 1e-4
    assert rows["algorithm.advantage.eps"][1].startswith("(grpo, dr_grpo, rloo, reinforce_pp) eps of the std")
    assert "algorithm.advantage.eps" in valid_keys() and "algorithm.scale_rewards" not in valid_keys()


def test_trl_scale_rewards_maps_onto_the_nested_key_quietly(capsys):
    assert resolve_config({"scale_rewards": False}).algorithm.advantage.as_dict() == \
        {"name": "grpo", "eps": 1e-4, "scale_rewards": "none"}
    gdpo = resolve_config({"multi_objective_aggregation": "normalize_then_sum", "scale_rewards": "group"}).algorithm
    assert (gdpo.reward_combination, gdpo.advantage.params.scale_rewards) == ("normalize_then_sum", "batch")
    assert resolve_config({"loss_type": "dr_grpo", "scale_rewards": "none"}).algorithm.advantage.as_dict() == \
        {"name": "grpo", "eps": 1e-4, "scale_rewards": "none"}
    assert "is now" not in capsys.readouterr().err
    # TRL keys under another entry chosen by our own key: quietly nothing, as rloo has no std
    assert build_config({"algorithm": {"advantage": "rloo"}}, from_trl({"scale_rewards": "batch"})[0]
                        ).algorithm.advantage.as_dict() == {"name": "rloo", "eps": 1e-4}


def test_a_run_saved_with_flat_advantage_keys_compares_equal(capsys):
    cfg = build_config(overrides={"algorithm.preset": "rloo", "algorithm.advantage.eps": 1e-5})
    saved = to_dict(cfg)
    saved["algorithm"] = {**{k: v for k, v in saved["algorithm"].items() if k != "advantage"},
                          "advantage_estimator": "rloo", "advantage_eps": 1e-5, "scale_rewards": "none"}
    assert flat_config(saved)["algorithm.advantage"] == {"name": "rloo", "eps": 1e-5}
    assert config_changes(saved, cfg) == []
    assert refused_change(saved, cfg, Path("checkpoint-2")) is None
    assert capsys.readouterr().err == ""
    grpo = build_config(overrides={"algorithm.preset": "rloo", "algorithm.advantage": "grpo"})
    assert [c.split(":")[0] for c in config_changes(saved, grpo)] == ["algorithm.advantage"]


# ---------------------------------------------------------------- algorithm.off_policy_mask (DeepSeek-V3.2's mask)


def test_off_policy_mask_nested_flat_trl_and_saved_flat(capsys, monkeypatch):
    monkeypatch.setattr("grpo.config.aliases.PRINTED", set())
    assert build_config().algorithm.off_policy_mask.as_dict() == {"name": "kl", "threshold": None}     # off
    nested = build_config({"algorithm": {"off_policy_mask": {"name": "ratio", "threshold": 2.0}}}).algorithm
    assert nested.off_policy_mask.as_dict() == {"name": "ratio", "threshold": 2.0}
    flat = build_config(overrides={"algorithm.off_policy_mask_measure": "ratio",
                                   "algorithm.off_policy_mask_threshold": 2.0}).algorithm
    assert flat == nested
    assert capsys.readouterr().err.splitlines() == [
        "grpo: algorithm.off_policy_mask_measure is now algorithm.off_policy_mask",
        "grpo: algorithm.off_policy_mask_threshold is now algorithm.off_policy_mask.threshold"]
    trl = resolve_config({"off_policy_mask_threshold": 0.5}).algorithm.off_policy_mask
    assert trl.as_dict() == {"name": "kl", "threshold": 0.5} and "is now" not in capsys.readouterr().err
    cfg = build_config(overrides={"algorithm.preset": "dsv32"})
    saved = to_dict(cfg)
    saved["algorithm"] = {**{k: v for k, v in saved["algorithm"].items() if k != "off_policy_mask"},
                          "off_policy_mask_threshold": 0.5, "off_policy_mask_measure": "kl"}
    assert config_changes(saved, cfg) == [] and capsys.readouterr().err == ""
