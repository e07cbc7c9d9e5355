"""TRL flag spellings on grpo's command line, and `trl grpo` recipe files read by train and rewards check:
values parsed as TRL's HfArgumentParser parses them, bad ones one-line errors naming the flag or file."""

import pytest

from grpo.cli.common import parse_overrides, read_given
from grpo.cli.main import main
from grpo.cli.rewards_check import check_config
from grpo.config import ConfigError


@pytest.mark.parametrize("text, value", [("1", True), ("0", False), ("yes", True), ("No", False), ("TRUE", True),
                                         ("false", False), ("t", True), ("F", False), ("y", True), ("n", False)])
def test_boolean_flags_read_as_trl_reads_them(text, value):
    assert parse_overrides(["--use_peft", text], trl=True) == {"use_peft": value}
    assert parse_overrides([f"--bf16={text}"], trl=True) == {"bf16": value}


@pytest.mark.parametrize("argv, message", [
    (["--bf16", "maybe"], "TRL flag --bf16 expects true or false \\(yes/no, t/f, y/n, 1/0\\), got 'maybe'"),
    (["--use-peft", "2"], "TRL flag --use-peft expects true or false .*got 2"),
    (["--disable_tqdm=abc"], "TRL flag --disable_tqdm expects true or false"),
    (["--learning_rate"], "TRL flag --learning_rate needs a value"),
    (["--learning-rate", "--beta", "0"], "TRL flag --learning-rate needs a value"),
    (["--num-generations", "abc"], "TRL flag --num-generations expects an integer, got 'abc'"),
    (["--gradient_accumulation_steps", "0"], "TRL flag --gradient_accumulation_steps must be >= 1, got 0"),
    (["--max_steps", "abc"], "TRL flag --max_steps expects an integer, got 'abc'"),
    (["--generation_kwargs", "abc"], "TRL flag --generation_kwargs expects a mapping \\(a JSON object"),
    (["--generation_kwargs", "[1,2]"], "TRL flag --generation_kwargs expects a mapping .*got \\[1, 2\\]"),
    (["--model_init_kwargs", "abc"], "TRL flag --model_init_kwargs expects a mapping"),
    (["--reward_weights", "1.0", "x"], "TRL flag --reward_weights \\(entry 'x'\\) expects a number, got 'x'"),
    (["--push_to_hub"], "TRL flag --push_to_hub: no hub uploads here"),
    (["--no_shuffle_dataset", "x"], "TRL flag --no_shuffle_dataset takes no value, got 'x'"),
])
def test_bad_flag_values_are_errors_naming_the_flag_as_written(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_overrides(argv, trl=True)


def test_list_flags_take_several_values_as_trl_does():
    """TRL's parser gives list fields nargs='+': `--reward_funcs a b` is a list of two."""
    assert parse_overrides(["--reward_funcs", "rewards.a", "rewards.b", "--report_to", "tensorboard", "wandb",
                            "--lora_target_modules", "q_proj", "v_proj", "--reward_weights", "1", "0.5",
                            "--learning_rate", "1e-6"], trl=True) == {
        "reward_funcs": ["rewards.a", "rewards.b"], "report_to": ["tensorboard", "wandb"],
        "lora_target_modules": ["q_proj", "v_proj"], "reward_weights": [1.0, 0.5], "learning_rate": 1e-6}
    assert parse_overrides(["--reward_funcs", "accuracy"], trl=True) == {"reward_funcs": ["accuracy"]}
    assert parse_overrides(["--reward_funcs", "[a, b]"], trl=True) == {"reward_funcs": ["a", "b"]}
    with pytest.raises(ConfigError, match="unrecognised argument 'x'"):   # one value for a scalar key
        parse_overrides(["--learning_rate", "1e-6", "x"], trl=True)


def test_negated_and_json_and_text_flags():
    assert parse_overrides(["--no_shuffle_dataset", "--no-gradient-checkpointing"], trl=True) == {
        "shuffle_dataset": False, "gradient_checkpointing": False}
    assert parse_overrides(["--generation_kwargs", '{"top_k": 5}', "--run_name", "yes", "--max_steps", "-1"],
                           trl=True) == {"generation_kwargs": {"top_k": 5}, "run_name": "yes", "max_steps": -1}


def test_vllm_flags_read_as_trl_reads_them():
    """A bare --use_vllm is true; host and URL stay text; `none` is TRL's None for vllm_max_model_length."""
    assert parse_overrides(["--use_vllm", "--vllm_mode", "server", "--vllm_server_host", "0.0.0.0",
                            "--vllm-server-base-url", "http://gen:8000", "--vllm_max_model_length", "none",
                            "--vllm_gpu_memory_utilization", "0.45", "--vllm_server_port", "8001"], trl=True) == {
        "use_vllm": True, "vllm_mode": "server", "vllm_server_host": "0.0.0.0", "vllm_server_base_url": "http://gen:8000",
        "vllm_max_model_length": None, "vllm_gpu_memory_utilization": 0.45, "vllm_server_port": 8001}
    with pytest.raises(ConfigError, match="TRL flag --vllm_mode needs a value"):
        parse_overrides(["--vllm_mode"], trl=True)
    with pytest.raises(ConfigError, match="TRL flag --vllm_server_port expects an integer, got 'x'"):
        parse_overrides(["--vllm_server_port", "x"], trl=True)


def test_a_vllm_recipe_file_sets_the_engine(tmp_path):
    from grpo.cli.common import resolve_given

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("use_vllm: true\nvllm_mode: colocate\nvllm_gpu_memory_utilization: 0.5\n"
                      "generation_kwargs: {max_tokens: 40, top_p: 0.95}\n")
    cfg = resolve_given(str(recipe), [], {})
    assert (cfg.rollout.engine, cfg.rollout.vllm.mode, cfg.rollout.vllm.gpu_memory_utilization) == ("vllm", "colocate", 0.5)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.top_p, cfg.algorithm.rollout_correction) == (40, 0.95, "sequence_mask")
    recipe.write_text("use_vllm: true\nvllm_mode: remote\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: TRL key 'vllm_mode': 'remote' is none of colocate \\| server$"):
        resolve_given(str(recipe), [], {})
    recipe.write_text("generation_kwargs: {num_beams: 4}\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: TRL key generation_kwargs: num_beams has no equivalent here"):
        resolve_given(str(recipe), [], {})


def test_recipe_file_errors_name_the_file_and_the_trl_key(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1.0e-6\nnum_generations: abc\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: TRL key 'num_generations' expects an integer, got 'abc'$"):
        read_given(str(recipe), [])
    recipe.write_text("learning_rat: 1.0e-6\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: key 'learning_rat' \\(did you mean 'learning_rate'\\?\\)"):
        read_given(str(recipe), [])
    recipe.write_text("model_revision: v2\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: TRL key 'model_revision': grpo loads local model directories"):
        read_given(str(recipe), [])


def test_gradient_checkpointing_kwargs_is_a_trl_key_not_a_section(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("gradient_checkpointing_kwargs: {use_reentrant: false}\nbeta: 0.0\n")
    given, overrides = read_given(str(recipe), ["--optim.lr", "2e-6"])
    assert given == {"gradient_checkpointing_kwargs": {"use_reentrant": False}, "beta": 0.0}
    assert overrides == {"optim.lr": "2e-6"}


def test_cli_prints_one_line_for_bad_trl_values(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1.0e-6\nnum_generations: 2\n")
    assert main(["train", "--config", str(recipe), "--steps_per_generation", "x"]) == 2
    assert capsys.readouterr().err == "error: TRL flag --steps_per_generation expects an integer, got 'x'\n"
    assert main(["train", "--config", str(recipe), "--report_to", "5"]) == 2
    assert "log.report_to: unknown tracker '5'" in capsys.readouterr().err


def test_rewards_check_reads_a_trl_recipe_as_train_does(tmp_path):
    """`grpo rewards check --config` takes the same `trl grpo` recipe as `grpo train --config`."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"dataset_name: {tmp_path / 'p.jsonl'}\nreward_funcs: [accuracy, format]\nreward_weights: "
                      f"[1.0, 0.5]\nlearning_rate: 1.0e-6\nuse_vllm: false\n")
    cfg = check_config(str(recipe), None, None, None, ["--reward_funcs", "format", "accuracy", "--data.split", "x"])
    assert cfg.data.dataset == str(tmp_path / "p.jsonl")
    assert cfg.reward.functions == ["format", "accuracy"] and cfg.reward.weights == [1.0, 0.5]
    assert cfg.data.split == "x"
    cfg = check_config(str(recipe), ["exact_match", "format"], None, "zero", [])    # the command's own flags win
    assert cfg.reward.functions == ["exact_match", "format"] and cfg.reward.reward_errors == "zero"


def test_errors_of_combined_trl_keys_name_the_file(tmp_path):
    """Batch keys are mapped together (file and flags): their error names the file, and the flags when given."""
    import argparse

    from grpo.cli.main import config_from_args

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("per_device_train_batch_size: 6\nnum_generations: 4\nnum_train_epochs: 2\nmax_steps: 8\n")
    args = argparse.Namespace(config=str(recipe), reward=None, **{k: None for k in ("model", "dataset", "output_dir",
                              "max_steps", "seed", "algorithm", "resume")})
    with pytest.raises(ConfigError, match=f"^{recipe}: TRL keys per_device_train_batch_size=6 .* not divisible by "
                                          f"num_generations=4$"):
        config_from_args(args, [])
    epochs = config_from_args(args, ["--num_generations", "3", "--max_steps", "-1"]).train   # TRL: 2 epochs then
    assert epochs.num_train_epochs == 2.0
    with pytest.raises(ConfigError, match=f"^{recipe} with the TRL flags: TRL keys per_device_train_batch_size=6 "):
        config_from_args(args, ["--num_generations", "5", "--max_steps", "-1"])     # 6 rows not divisible by 5
    assert config_from_args(args, ["--num_generations", "3"]).train.prompts_per_step == 2


def test_scale_rewards_none_and_optim_adamw_from_a_recipe_and_flags(tmp_path):
    """TRL's documented `scale_rewards: none` (Dr. GRPO) and transformers' `optim: adamw_torch` in a recipe file and
    as flags; a flag of an optimizer grpo lacks is one line naming TRL's optim key."""
    from grpo.cli.common import resolve_given

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("scale_rewards: none\noptim: adamw_torch\nloss_type: dr_grpo\n")
    cfg = resolve_given(str(recipe), [], {})
    assert (cfg.algorithm.advantage.params.scale_rewards, cfg.algorithm.loss_agg_mode) == \
        ("none", "seq-mean-token-sum-norm")
    cfg = resolve_given(None, ["--scale_rewards", "none", "--optim", "adamw_torch_fused", "--learning_rate", "2e-6"], {})
    assert (cfg.algorithm.advantage.params.scale_rewards, cfg.optim.lr) == ("none", 2e-6)
    with pytest.raises(ConfigError, match="TRL flag --optim: 'sgd' is transformers' optimizer name \\(TRL's optim key\\)"):
        resolve_given(None, ["--optim", "sgd"], {})


def test_unmapped_trl_keys_of_a_recipe_are_named_together_with_the_file(tmp_path):
    """A mapping under a TRL name (lr_scheduler_kwargs: {}) is named with the other unmapped keys, not reported
    later as an unknown section; optim: adamw_torch is accepted (a note) and not named."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rat: 1.0e-6\nlr_scheduler_kwargs: {}\noptim: adamw_torch\neval_on_start: true\n")
    with pytest.raises(ConfigError) as e:
        read_given(str(recipe), [])
    assert str(e.value).startswith(f"{recipe}: keys 'learning_rat' (did you mean 'learning_rate'?), "
                                   "'lr_scheduler_kwargs', 'eval_on_start': no TRL key grpo maps")
    recipe.write_text("lr_scheduler_kwargs: {warmup: 1}\n")
    with pytest.raises(ConfigError, match=f"^{recipe}: key 'lr_scheduler_kwargs': no TRL key grpo maps"):
        read_given(str(recipe), [])
