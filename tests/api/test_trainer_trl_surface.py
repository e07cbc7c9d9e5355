"""TRL / transformers Trainer surface on grpo.Trainer: trainer_state seen by rewards, push_to_hub, train()'s
TrainOutput fields, trainer.state, IterableDataset."""

import pytest
from datasets import Dataset, IterableDataset

import grpo
from grpo.data.datasets_io import DataError
from grpo.modeling.models import build_model, build_tokenizer

ROWS = [{"prompt": f"{i}+1="} for i in range(16)]


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def trainer(tmp_path, rewards=(length,), train_dataset=ROWS, **over):
    tok = build_tokenizer()
    config = {"num_generations": 2, "per_device_train_batch_size": 4, "steps_per_generation": 2, "num_iterations": 2,
              "max_steps": 8, "max_completion_length": 4, "log.progress_bar": False, "cpu.num_threads": 1,
              "train.output_dir": str(tmp_path / "run"), "train.save_final": False, **over}
    return grpo.Trainer(build_model(tok, "micro", seed=0), reward_funcs=list(rewards), train_dataset=train_dataset,
                        tokenizer=tok, config=config)


def test_rewards_see_trls_trainer_state(tmp_path):
    seen = []

    def curriculum(completions, trainer_state, **kwargs):
        s = trainer_state
        seen.append((s.global_step, s.max_steps, s.epoch, s.num_train_epochs, [r["step"] for r in s.log_history]))
        return [0.0] * len(completions)

    t = trainer(tmp_path, rewards=[curriculum])
    assert t.state.max_steps == 8 and t.config.train.max_steps == 2   # TRL's 8 updates = 2 generation batches here
    t.train()
    # TRL 1.16 with these keys (/tmp/exp/a5/trl_ref.py 2 2 1 8): a generation batch of 4 prompts is trained
    # num_iterations 2 x steps_per_generation 2 = 4 updates, so the rewards see (global_step, max_steps, epoch,
    # num_train_epochs) = (0, 8, 0, 1) then (4, 8, 4/16 = 0.25, 1). TRL logs every update (logging_steps 1), so
    # its second call sees 4 log entries; here a generation batch is logged once, under TRL's step 4.
    assert seen == [(0, 8, 0.0, 1, []), (4, 8, 0.25, 1, [4])]
    assert t.state.global_step == 8 and t.state.epoch == 0.5 and t.state.num_train_epochs == 1


def test_push_to_hub_is_refused_with_the_way_to_upload(tmp_path):
    t = trainer(tmp_path)
    with pytest.raises(NotImplementedError) as info:
        t.push_to_hub("me/model", private=True)
    assert str(info.value) == ("push_to_hub: grpo does not upload models; save with trainer.save_model(dir) and upload "
                               "that directory yourself with huggingface_hub: HfApi().upload_folder(folder_path=dir, "
                               "repo_id=...)")


def test_state_before_training_reads_the_output_directory(tmp_path):
    trainer(tmp_path, max_steps=4).train()                 # 1 generation batch of 4 updates
    again = trainer(tmp_path, max_steps=8)
    history = again.state.log_history
    assert [(r["step"], r["grpo_step"]) for r in history] == [(4, 1)] and again.state.global_step == 4
    assert history[0]["reward"] == history[0]["reward/total/mean"] and "rewards/length/mean" in history[0]


def test_an_iterable_dataset_gives_the_rows_the_run_draws_in_the_streams_order(tmp_path):
    """TRL takes a datasets.IterableDataset: the run reads the first max_steps x prompts_per_step rows (2 steps x 4
    prompts here), keeps their order (TRL does not shuffle a stream), and a stream as eval_dataset is read whole."""
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.extend(prompts)
        return [0.0] * len(completions)

    pulled = []

    def rows():
        for row in ROWS:
            pulled.append(row["prompt"])
            yield row

    stream = IterableDataset.from_generator(rows)
    t = trainer(tmp_path, rewards=[spy], train_dataset=stream, num_iterations=1, steps_per_generation=1,
                max_steps=2, per_device_train_batch_size=8)
    assert t.config.data.shuffle is False and pulled[:8] == [r["prompt"] for r in ROWS[:8]]
    t.train()
    assert list(dict.fromkeys(seen)) == [r["prompt"] for r in ROWS[:8]]     # the stream's first 8, in its order
    tok = build_tokenizer()
    evaluated = grpo.Trainer(build_model(tok, "micro", seed=0), reward_funcs=[length], tokenizer=tok,
                             train_dataset=ROWS, eval_dataset=IterableDataset.from_generator(lambda: iter(ROWS[:5])),
                             config={"train.output_dir": str(tmp_path / "eval")})
    assert len(evaluated.eval_records.rows) == 5


def test_an_iterable_dataset_needs_max_steps_not_epochs(tmp_path):
    stream = IterableDataset.from_generator(lambda: iter(ROWS))
    with pytest.raises(DataError, match="^train_dataset: an IterableDataset has no length, so train.num_train_epochs "
                                        ".*: set max_steps$"):
        trainer(tmp_path, train_dataset=stream, max_steps=-1)


def test_a_short_stream_is_read_whole_with_a_warning(tmp_path):
    stream = IterableDataset.from_generator(lambda: iter(ROWS[:3]))
    with pytest.warns(UserWarning, match="ended after 3 rows of the 8 that 2 steps of 4 prompts draw"):
        t = trainer(tmp_path, train_dataset=stream, num_iterations=1, steps_per_generation=1, max_steps=2,
                    per_device_train_batch_size=8)
    assert t.records is not None and len(t.records.rows) == 3


def test_after_training_by_epochs_the_config_holds_the_resolved_step_count(tmp_path):
    """TRL's max_steps -1 / num_train_epochs 1: 16 prompts at 4 per step (8 completions of 2 per prompt) -> 4 steps;
    trainer.config says so after train(), as the run's config.yaml does."""
    t = trainer(tmp_path, max_steps=-1, num_train_epochs=1, num_iterations=1, steps_per_generation=1,
                per_device_train_batch_size=8)
    assert t.config.train.num_train_epochs == 1.0
    result = t.train()
    assert result.steps == 4 and t.config.train.max_steps == 4
