"""`grpo pipeline`'s stages through the Python API (grpo/cli/stages.py): a stage's args become the Config of
its command (sft, grpo) or its command's options (sample, eval, reward_model), read as its command line would."""

import pytest

from grpo.cli import evaluation, reward_model, sample
from grpo.cli.stages import command_options, grpo_config, sft_config
from grpo.config import ConfigError


def test_a_grpo_stage_is_grpo_trains_config():
    args = {"max-steps": 3, "seed": "7", "train.prompts_per_step": 4, "log.progress_bar": "false", "beta": 0.02,
            "reward": "exact_match", "optim.lr": "1e-5", "resume": False}
    cfg = grpo_config(args, "runs/p/rl", resuming=True)
    assert (cfg.train.max_steps, cfg.train.seed, cfg.train.prompts_per_step) == (3, 7, 4)
    assert (cfg.log.progress_bar, cfg.algorithm.beta, cfg.optim.lr) == (False, 0.02, 1e-5)  # "false", TRL beta
    assert (str(cfg.train.output_dir), cfg.train.resume, cfg.reward.functions) == ("runs/p/rl", "auto", ["exact_match"])
    assert grpo_config({"resume": True}, "runs/p/rl", resuming=False).train.resume == "auto"   # a bare --resume


def test_a_section_key_wins_over_a_trl_name_and_a_named_flag_over_both():
    cfg = grpo_config({"learning_rate": 1e-6, "optim.lr": 3e-6, "max_steps": 9, "train.max_steps": 5}, "out", False)
    assert (cfg.optim.lr, cfg.train.max_steps) == (3e-6, 9)


@pytest.mark.parametrize("args, message", [
    ({"bogus": 1}, "unrecognised argument '--bogus'"),
    ({"learning-rate": "fast"}, "TRL flag --learning_rate expects a number, got 'fast'"),
])
def test_a_bad_grpo_stage_arg_is_a_config_error_naming_the_flag(args, message):
    with pytest.raises(ConfigError, match=message):
        grpo_config(args, "out", resuming=False)


def test_an_sft_stage_is_grpo_sfts_config_and_needs_a_dataset():
    cfg = sft_config({"dataset": "rows.jsonl", "max-steps": 2, "optim.lr": 2e-3}, "runs/p/cold", resuming=True)
    assert (cfg.data.dataset, cfg.train.max_steps, cfg.optim.lr) == ("rows.jsonl", 2, 2e-3)
    assert (str(cfg.train.output_dir), cfg.train.resume) == ("runs/p/cold", "auto")
    with pytest.raises(ConfigError, match="an sft stage needs a dataset"):
        sft_config({"max-steps": 2}, "runs/p/cold", resuming=False)
    with pytest.raises(ConfigError, match="unrecognised argument '--learning_rate'"):    # grpo sft takes no TRL names
        sft_config({"dataset": "rows.jsonl", "learning_rate": 1e-5}, "runs/p/cold", resuming=False)


def test_an_eval_stage_gets_evals_options_with_its_defaults():
    options = command_options(evaluation.add_parser, "eval", {"problems": "8", "reward": "accuracy", "maj": True,
                                                               "max-new-tokens": 12, "k": 1, "out": "runs/p/test"})
    assert (options.problems, options.reward, options.maj, options.max_new_tokens, options.k) == (
        8, ["accuracy"], True, 12, "1")                      # --k is text, as on the command line
    assert (options.split, options.task, options.temperature, options.samples, options.out) == (
        "train", "arithmetic", 0.0, 1, "runs/p/test")


def test_a_sample_stage_resumes_and_a_reward_model_stage_needs_its_required_flags():
    options = command_options(sample.add_parser, "sample", {"num-samples": 4, "dedupe": True, "out": "s.jsonl",
                                                            "resume": True})
    assert (options.num_samples, options.dedupe, options.resume, options.keep) == (4, True, True, "correct")
    with pytest.raises(ConfigError, match="required: --samples, --label"):
        command_options(reward_model.add_parser, "reward-model", {"out": "rm"})
    with pytest.raises(ConfigError, match="grpo eval: unrecognised argument '--bogus'"):
        command_options(evaluation.add_parser, "eval", {"bogus": 1})
