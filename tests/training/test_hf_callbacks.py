"""Hugging Face TrainerCallback objects in grpo.Trainer(callbacks=...), as TRL users pass them."""

import pytest
from transformers import TrainerCallback

import grpo
from grpo.modeling.models import build_model, build_tokenizer

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]


def digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


class Recorder(TrainerCallback):
    def __init__(self, stop_at=None):
        self.events, self.stop_at = [], stop_at

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("begin", state.global_step, args.max_steps))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step", state.global_step))
        if state.global_step == self.stop_at:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("log", state.global_step, "reward/digits/mean" in logs, len(state.log_history)))

    def on_save(self, args, state, control, **kwargs):
        self.events.append(("save", state.global_step))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.events.append(("end", state.global_step, model is not None))


def trainer(tmp_path, callback, **over):
    tok = build_tokenizer()
    config = {"max_steps": 3, "num_generations": 4, "max_completion_length": 6, "train.prompts_per_step": 2,
              "log.progress_bar": False, "train.num_threads": 1, "train.output_dir": str(tmp_path / "run"),
              "train.save_steps": 2, **over}
    return grpo.Trainer(build_model(tok, "micro", seed=0), reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok,
                        config=config, callbacks=[callback])


def test_a_trainer_callback_sees_hugging_faces_hooks(tmp_path):
    rec = Recorder()
    trainer(tmp_path, rec).train()
    assert rec.events == [("begin", 0, 3),
                          ("step", 1), ("log", 1, True, 1),
                          ("step", 2), ("log", 2, True, 2), ("save", 2),
                          ("step", 3), ("log", 3, True, 3), ("save", 3),
                          ("end", 3, True)]


def test_should_training_stop_ends_the_run_with_a_checkpoint(tmp_path):
    result = trainer(tmp_path, Recorder(stop_at=1)).train()
    assert result.steps == 1 and result.stopped_by == "callback"
    assert (tmp_path / "run" / "checkpoint-1").is_dir()
