import re
import pytest

from grpo.config import Config, ConfigError, build_config, field_help, load_yaml, valid_keys


def test_defaults_are_deepseekmath_grpo():
    cfg = build_config()
    assert cfg == Config()
    assert (cfg.algorithm.beta, cfg.algorithm.epsilon, cfg.algorithm.kl_estimator) == (0.04, 0.2, "k3")
    assert cfg.algorithm.loss_agg_mode == "seq-mean-token-mean"


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  num_generations: 4\nalgorithm:\n  beta: 0.1\n")
    cfg = build_config(load_yaml(f), {"algorithm.beta": 0, "optim.lr": "1e-5"})
    assert cfg.rollout.num_generations == 4
    assert cfg.algorithm.beta == 0.0 and isinstance(cfg.algorithm.beta, float)
    assert cfg.optim.lr == 1e-5


def test_unknown_key_lists_valid_ones():
    with pytest.raises(ConfigError) as e:
        build_config(overrides={"algorithm.betta": 0.1})
    assert "algorithm.betta" in str(e.value) and "algorithm.beta" in str(e.value)
    with pytest.raises(ConfigError, match="unknown config key 'optimizer'"):
        build_config({"optimizer": {"lr": 1}})


@pytest.mark.parametrize("key,value,message", [
    ("rollout.num_generations", 1, "num_generations must be >= 2"),
    ("rollout.num_generations", "eight", "expects an integer"),
    ("algorithm.beta", -0.1, "beta must be >= 0"),
    ("algorithm.beta", True, "expects a number"),
    ("algorithm.kl_estimator", "k9", "kl_estimator must be one of"),
    ("algorithm.loss_agg_mode", "mean", "loss_agg_mode must be one of"),
    ("log.progress_bar", "yes", "expects true/false"),
    ("train.max_steps", 2.5, "expects an integer"),
    ("reward.weights", [1.0, 2.0, 3.0], "one weight per entry"),
    ("rollout.top_p", 0.0, "top_p must be in"),
    ("rollout.min_p", 1.0, "rollout.min_p must be in \\[0, 1\\)"),
    ("algorithm.policy_loss", "ppo", "algorithm.policy_loss must be one of \\['cispo', 'clip', 'sapo', 'vespo'\\]"),
    ("algorithm.clip_delta", 1.0, "algorithm.policy_loss.delta must be > 1"),   # a flat alias, under clip
    ("algorithm.entropy_control", "pid", "algorithm.entropy_control must be one of \\['adaptive', 'fixed'\\]"),
    ("algorithm.entropy_control", {"name": "adaptive", "coef_min": 2.0}, "algorithm.entropy_control.coef_min <= coef_max"),
    ("algorithm.policy_loss", {"name": "cispo", "max": 0.0}, "algorithm.policy_loss.max must be > 0"),
    ("algorithm.policy_loss", {"name": "sapo", "tau_neg": 0.0}, "algorithm.policy_loss.tau_pos and tau_neg must be > 0"),
    ("algorithm.policy_loss", {"name": "vespo", "lambda_neg": 0.0},
     "algorithm.policy_loss.k_pos, k_neg must be >= 0 and lambda_pos, lambda_neg > 0 \\(vespo\\)"),
    ("rollout.repetition_penalty", 0.0, "rollout.repetition_penalty must be > 0"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        build_config(overrides={key: value})


def test_yaml_errors_name_the_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("rollout:\n  num_generations: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: invalid YAML"):
        load_yaml(f)
    with pytest.raises(ConfigError, match="config file not found"):
        load_yaml(tmp_path / "missing.yaml")


def test_every_key_has_help():
    rows = field_help()
    assert [k for k, _, _ in rows] == valid_keys()
    assert all(h for _, _, h in rows)


@pytest.mark.parametrize("flat,message", [
    ({"optim.lr": float("inf")}, "config key 'optim.lr' must be a finite number, got inf"),
    ({"optim.lr": "inf"}, "config key 'optim.lr' must be a finite number, got inf"),      # the command line's text
    ({"optim.lr": float("nan")}, "config key 'optim.lr' must be a finite number, got nan"),
    ({"reward.functions": ["accuracy", "format"], "reward.weights": [1.0, float("nan")]},
     "config key 'reward.weights' must be a finite number, got nan"),
    ({"algorithm.beta": float("inf")}, "config key 'algorithm.beta' must be a finite number, got inf"),
    ({"optim.adam_beta2": 1.0}, "optim.adam_beta1 and optim.adam_beta2 must be in [0, 1)"),
    ({"optim.weight_decay": -0.1}, "optim.weight_decay must be >= 0"),
])
def test_numbers_that_pass_as_floats_but_mean_nothing_name_the_key(flat, message):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=flat)
    assert str(info.value) == message


def test_a_config_object_with_an_infinite_lr_or_weight_is_rejected_by_validate():
    import dataclasses

    from grpo.config.checks import validate

    cfg = Config()
    with pytest.raises(ConfigError, match="optim.lr must be a finite number > 0, got inf"):
        validate(dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=float("inf"))))
    with pytest.raises(ConfigError, match=r"reward.weights must be finite numbers, got \[1.0, nan\]"):
        validate(dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, functions=["a", "b"],
                                                                         weights=[1.0, float("nan")])))


@pytest.mark.parametrize("name,why", [
    ("../metrics.jsonl", " (no directories, no '..')"),
    ("/tmp/metrics.jsonl", " (no directories, no '..')"),
    ("logs/metrics.jsonl", " (no directories, no '..')"),
    ("..", " (no directories, no '..')"),
    ("checkpoint-5", ": the run writes that name itself"),
    (".checkpoint-5.tmp", ": the run writes that name itself"),
    ("config.yaml", ": the run writes that name itself"),
    (".grpo.lock", ": the run writes that name itself"),
    ("samples.jsonl", ": the run writes that name itself"),
    ("alerts.jsonl", ": the run writes that name itself"),
    ("summary.json", ": the run writes that name itself"),
])
def test_metrics_file_must_be_a_plain_file_name_inside_output_dir(name, why):
    with pytest.raises(ConfigError) as info:
        build_config(overrides={"log.metrics_file": name})
    assert str(info.value).startswith(f"log.metrics_file must be a plain file name inside train.output_dir, "
                                      f"got '{name}'{why}")
    assert build_config(overrides={"log.metrics_file": "train-metrics.jsonl"}).log.metrics_file == "train-metrics.jsonl"


@pytest.mark.parametrize("seed", [-5, 2 ** 32])
def test_a_seed_out_of_range_names_the_key(seed):
    with pytest.raises(ConfigError, match=re.escape(f"train.seed must be in [0, 2**32 - 1], got {seed}")):
        build_config(overrides={"train.seed": seed})


def test_an_empty_output_dir_is_refused():
    """'' would put the run's files in the working directory without saying so."""
    with pytest.raises(ConfigError, match="train.output_dir may not be empty"):
        build_config(overrides={"train.output_dir": ""})


def test_a_nested_group_takes_a_mapping_and_dotted_overrides():
    """reward.reward_model_update is a group of keys: a YAML mapping, `section.group.key` overrides on top
    of it, each key checked by its type and listed by --help-config."""
    from grpo.config import field_help, valid_keys

    cfg = build_config({"reward": {"reward_model_update": {"every": 4, "label": "accuracy", "replay": 0.2}}},
                       {"reward.reward_model_update.replay": 0.1, "reward.reward_model_update.steps": 7})
    rmu = cfg.reward.reward_model_update
    assert (rmu.every, rmu.label, rmu.replay, rmu.lr) == (4, "accuracy", 0.1, 1e-4)
    assert "reward.reward_model_update.every" in valid_keys() and "reward.reward_model_update" not in valid_keys()
    assert ("reward.reward_model_update.replay", 0.1) in [(k, d) for k, d, _ in field_help()]
    with pytest.raises(ConfigError, match="'reward.reward_model_update.steps' expects an integer"):
        build_config(overrides={"reward.reward_model_update.steps": "many"})
    with pytest.raises(ConfigError, match="'reward.reward_model_update' expects a mapping of every, replay"):
        build_config({"reward": {"reward_model_update": 5}})
    with pytest.raises(ConfigError, match="unknown config key 'reward.timeout_s.x'"):
        build_config(overrides={"reward.timeout_s.x": 1})


def test_repetition_penalty_is_for_single_turn_rollouts():
    with pytest.raises(ConfigError, match="rollout.repetition_penalty applies to single-turn rollouts"):
        build_config(overrides={"rollout.env": "calculator", "rollout.repetition_penalty": 1.2})


def test_dual_clip_and_delta_belong_to_the_clip_loss():
    with pytest.raises(ConfigError, match="unknown parameter 'algorithm.policy_loss.ratio_c': algorithm.policy_loss "
                                          "sapo takes tau_pos, tau_neg"):
        build_config(overrides={"algorithm.policy_loss": "sapo", "algorithm.policy_loss.ratio_c": 3.0})
    # the flat alias sets the clip entry's parameter: under sapo it changes nothing, as the flat key did not
    cfg = build_config(overrides={"algorithm.policy_loss": "sapo", "algorithm.clip_ratio_c": 3.0})
    assert cfg.algorithm.policy_loss.as_dict() == {"name": "sapo", "tau_pos": 1.0, "tau_neg": 1.05}


def test_the_reserved_run_files_are_the_names_the_run_writes():
    from grpo.config.checks import RUN_FILES
    from grpo.state.metrics import ALERTS_FILE
    from grpo.state.samples import SAMPLES_FILE

    assert {SAMPLES_FILE, ALERTS_FILE} <= set(RUN_FILES)


def test_a_key_given_twice_in_a_yaml_file_is_an_error_naming_file_and_line(tmp_path):
    from grpo.config.build import load_yaml

    path = tmp_path / "run.yaml"
    path.write_text("train:\n  prompts_per_step: 2\nrollout:\n  num_generations: 4\ntrain:\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert str(info.value) == (f"{path}:5: key 'train' appears twice in one mapping (the second would silently "
                               "replace the first)")
    path.write_text("train:\n  max_steps: 2\n  max_steps: 3\n")
    with pytest.raises(ConfigError, match=":3: key 'max_steps' appears twice"):
        load_yaml(path)
    path.write_text("train:\n  max_steps: 2\nrollout:\n  max_steps: 3\n")          # same name, other mapping: fine
    assert load_yaml(path) == {"train": {"max_steps": 2}, "rollout": {"max_steps": 3}}
