"""TRL's view of a run (grpo/training/trl_view.py): step counting in optimizer updates, epochs,
TrainingArguments fields and TRL's log key names."""

import dataclasses

import pytest
from transformers import DefaultFlowCallback, TrainerControl
from transformers import TrainerState as HFTrainerState

from grpo.config import build_config
from grpo.rewards.context import TrainerState
from grpo.training.trl_view import TrlProgress, training_arguments, trl_logs, trl_name


def cfg(**over):
    base = {"train.prompts_per_step": 4, "rollout.num_generations": 2, "train.max_steps": 2, "train.micro_batch_size": 2,
            "algorithm.mini_batches": 2, "algorithm.num_iterations": 2, "train.save_steps": 1, "optim.lr": 3e-6}
    return build_config(overrides={**base, **over})


def test_trl_names_of_grpo_metrics():
    assert [trl_name(k) for k in ("loss/total", "reward/total/mean", "reward/total/std", "kl/mean", "policy/entropy",
                                  "optim/lr", "optim/grad_norm", "reward/acc/mean", "reward/acc/std",
                                  "reward/acc/max", "completion/length_mean", "completion/truncated_frac",
                                  "policy/clip_high_frac", "eval/reward/acc", "eval/completion_length",
                                  "time/step_s")] == [
        "loss", "reward", "reward_std", "kl", "entropy", "learning_rate", "grad_norm", "rewards/acc/mean",
        "rewards/acc/std", None, "completions/mean_length", "completions/clipped_ratio", "clip_ratio/high_mean",
        "eval_rewards/acc/mean", "eval_completion_length", None]


def test_trl_logs_keeps_grpo_keys_and_adds_trl_names():
    record = {"step": 3, "loss/total": 0.5, "reward/total/mean": 1.5, "reward/fmt/mean": 0.25, "time/step_s": 2.0}
    assert trl_logs(record) == {**record, "loss": 0.5, "reward": 1.5, "rewards/fmt/mean": 0.25}
    assert record == {"step": 3, "loss/total": 0.5, "reward/total/mean": 1.5, "reward/fmt/mean": 0.25,
                      "time/step_s": 2.0}                # the record itself (metrics.jsonl's) is not changed


def test_training_arguments_in_trls_units():
    a = training_arguments(cfg())
    # a step: 4 prompts x 2 = 8 completions in 2 mini-batches -> 4 completions per update, micro-batches of 2
    # -> per_device 2, accumulation 2, steps_per_generation 2 x 2 = 4; updates per step = 2 iterations x 2 = 4
    assert (a.per_device_train_batch_size, a.gradient_accumulation_steps, a.steps_per_generation,
            a.generation_batch_size, a.num_generations, a.num_iterations) == (2, 2, 4, 8, 2, 2)
    assert (a.max_steps, a.save_steps, a.logging_steps, a.learning_rate, a.save_strategy) == (8, 4, 4, 3e-6, "steps")
    whole = training_arguments(cfg(**{"train.micro_batch_size": 0, "algorithm.mini_batches": 1}))
    assert (whole.per_device_train_batch_size, whole.gradient_accumulation_steps, whole.steps_per_generation) == (8, 1, 1)


def test_reward_state_counts_optimizer_updates_as_trl():
    # TRL 1.16 (trl_ref_state.py: 16 prompts, num_generations 2, per_device 4, steps_per_generation 2, max_steps 4):
    # the reward sees (global_step, max_steps) = (0, 4) then (2, 4): one generation batch per 2 updates.
    p = TrlProgress(cfg(**{"algorithm.num_iterations": 1, "train.micro_batch_size": 4}), num_prompts=16)
    assert [(p.reward_state(s).global_step, p.reward_state(s).max_steps) for s in (1, 2)] == [(0, 4), (2, 4)]
    # epochs: 4 prompts a step of 16 -> 0.25 per step; the 2 steps touch 1 epoch
    assert [p.reward_state(s).epoch for s in (1, 2)] == [0.0, 0.25] and p.num_train_epochs == 1
    # num_iterations 2 on top: 4 updates per generation batch, TRL's max_steps 8 -> (0, 8), (4, 8)
    p = TrlProgress(cfg(), num_prompts=16)
    state = p.reward_state(2)
    assert (state.global_step, state.max_steps, state.epoch) == (4, 8, 0.25)
    assert (state.logging_steps, state.save_steps, state.train_batch_size, state.is_world_process_zero) == (4, 4, 2, True)


def test_log_history_entries_use_trls_step_and_epoch():
    p = TrlProgress(cfg(), num_prompts=16, history=[{"step": 1, "loss/total": 4.0}])     # a resumed run's step 1
    entry = p.log({"step": 2, "loss/total": 1.0, "reward/total/mean": 0.5})
    assert entry == {"step": 8, "grpo_step": 2, "epoch": 0.5, "loss/total": 1.0, "loss": 1.0,
                     "reward/total/mean": 0.5, "reward": 0.5}
    assert [e["step"] for e in p.log_history] == [4, 8] and p.last is entry
    assert p.training_loss() == 1.0                      # this session's steps only (TRL's training_loss)
    state = p.reward_state(3)
    assert isinstance(state, TrainerState) and state.log_history is p.log_history


@pytest.mark.parametrize("num_prompts, epochs", [(16, 1), (3, 3), (0, 0)])
def test_num_train_epochs_rounds_up(num_prompts, epochs):
    assert TrlProgress(cfg(), num_prompts).num_train_epochs == epochs    # 2 steps x 4 prompts = 8 drawn


def test_a_trainer_callback_reads_the_fields_it_needs_from_the_arguments():
    """transformers' DefaultFlowCallback (every Trainer's) decides log / save / stop from the arguments' strategies
    and the state's intervals: with save_steps 1 grpo step = 4 updates, update 4 saves and logs, update 8 stops."""
    a = training_arguments(cfg(**{"train.eval_steps": 0}))
    assert (a.logging_strategy, a.save_strategy, a.eval_strategy, a.eval_delay, a.logging_first_step) == (
        "steps", "steps", "no", 0, False)
    state = HFTrainerState(max_steps=a.max_steps, logging_steps=a.logging_steps, save_steps=a.save_steps,
                           eval_steps=a.eval_steps, train_batch_size=a.per_device_train_batch_size)
    flow = DefaultFlowCallback()
    state.global_step = 3
    c = flow.on_step_end(a, state, TrainerControl())
    assert (c.should_log, c.should_save, c.should_evaluate, c.should_training_stop) == (False, False, False, False)
    state.global_step = 4
    c = flow.on_step_end(a, state, TrainerControl())
    assert (c.should_log, c.should_save, c.should_evaluate, c.should_training_stop) == (True, True, False, False)
    state.global_step = 8
    c = flow.on_step_end(a, state, TrainerControl())
    assert (c.should_log, c.should_save, c.should_training_stop) == (True, True, True)
    assert a.to_dict()["learning_rate"] == 3e-6 and '"max_steps": 8' in a.to_json_string()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.max_steps = 1                                  # read-only: changing it would not change the run


def test_the_progress_gives_the_arguments_its_epoch_count():
    assert training_arguments(cfg()).num_train_epochs is None              # the prompt count is not known yet
    assert TrlProgress(cfg(), num_prompts=3).args.num_train_epochs == 3    # 2 steps x 4 prompts of 3: 3 epochs
