"""Hugging Face TrainerCallback objects in grpo.Trainer(callbacks=...), as TRL users pass them."""

import json

import pytest
import torch
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
              "log.progress_bar": False, "cpu.num_threads": 1, "train.output_dir": str(tmp_path / "run"),
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
                          ("log", 3, False, 4),         # TRL's training summary (train_loss, train_runtime, ...)
                          ("end", 3, True)]


def test_should_training_stop_ends_the_run_with_a_checkpoint(tmp_path):
    result = trainer(tmp_path, Recorder(stop_at=1)).train()
    assert result.steps == 1 and result.stopped_by == "callback"
    assert (tmp_path / "run" / "checkpoint-1").is_dir()


HOOKS = ["on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_substep_end", "on_pre_optimizer_step",
         "on_optimizer_step", "on_step_end", "on_log", "on_evaluate", "on_save", "on_epoch_end", "on_train_end"]


class Every(TrainerCallback):
    """Records every hook as (name, global_step, epoch), and what the hooks are given."""

    def __init__(self):
        self.events, self.kwargs, self.logs, self.metrics, self.args = [], {}, [], [], None


def _record(name):
    def hook(self, args, state, control, **kwargs):
        self.events.append((name, state.global_step, round(state.epoch or 0.0, 4)))
        self.kwargs.setdefault(name, sorted(kwargs))
        self.args = args
        if name == "on_log":
            self.logs.append(kwargs["logs"])
        if name == "on_evaluate":
            self.metrics.append(kwargs["metrics"])
    return hook


for _name in HOOKS:
    setattr(Every, _name, _record(_name))

TRANSFORMERS_KWARGS = ["eval_dataloader", "lr_scheduler", "model", "optimizer", "processing_class", "train_dataloader"]


def trl_trainer(tmp_path, callback, max_steps=4, eval_dataset=None, **over):
    """TRL's batch keys: per_device 4, gradient_accumulation_steps 2, steps_per_generation 4 -> a generation batch of
    16 completions = 8 prompts, 2 optimizer updates of 8 completions, each 2 micro-batches of 4."""
    tok = build_tokenizer()
    config = {"max_steps": max_steps, "num_generations": 2, "per_device_train_batch_size": 4,
              "gradient_accumulation_steps": 2, "steps_per_generation": 4, "max_completion_length": 4,
              "log.progress_bar": False, "cpu.num_threads": 1, "train.output_dir": str(tmp_path / "run"),
              "train.save_final": False, **over}
    return grpo.Trainer(build_model(tok, "micro", seed=0), reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok,
                        config=config, callbacks=[callback], eval_dataset=eval_dataset)


def test_hooks_come_in_trls_order_counting_optimizer_updates(tmp_path):
    cb = Every()
    result = trl_trainer(tmp_path, cb).train()
    # TRL 1.16 with the same batch keys, 16 prompts and max_steps 4 (/tmp/exp/a5/trl_ref.py 1 4 2 4) calls, as
    # (hook, global_step, epoch): each update does 2 micro-batches (1 on_substep_end) and moves the epoch by
    # 4 prompts / 16 = 0.25; on_pre_optimizer_step comes from the optimizer's step pre-hook.
    update = [("on_substep_end",), ("on_pre_optimizer_step",), ("on_optimizer_step",)]
    expected = [("on_init_end", 0, 0.0), ("on_train_begin", 0, 0.0), ("on_epoch_begin", 0, 0.0)]
    for g in range(4):
        expected += [("on_step_begin", g, g / 4)] + [(u[0], g, g / 4) for u in update] + [("on_step_end", g + 1, (g + 1) / 4)]
        if g % 2 == 1:                                 # one grpo step = 2 updates: logged once, at its end
            expected.append(("on_log", g + 1, (g + 1) / 4))
    expected += [("on_epoch_end", 4, 1.0), ("on_log", 4, 1.0), ("on_train_end", 4, 1.0)]
    assert cb.events == expected
    assert cb.kwargs["on_step_end"] == TRANSFORMERS_KWARGS and cb.kwargs["on_init_end"] == TRANSFORMERS_KWARGS
    assert cb.kwargs["on_log"] == sorted([*TRANSFORMERS_KWARGS, "logs"])
    a = cb.args
    assert (a.per_device_train_batch_size, a.gradient_accumulation_steps, a.steps_per_generation, a.num_generations,
            a.max_steps, a.logging_steps, a.num_train_epochs, a.output_dir) == (4, 2, 4, 2, 4, 2, 1, str(tmp_path / "run"))
    step_log = cb.logs[0]
    for grpo_key, trl_key in [("loss/total", "loss"), ("reward/total/mean", "reward"), ("reward/total/std", "reward_std"),
                              ("kl/mean", "kl"), ("optim/lr", "learning_rate"), ("optim/grad_norm", "grad_norm"),
                              ("reward/digits/mean", "rewards/digits/mean"), ("policy/entropy", "entropy"),
                              ("completion/length_mean", "completions/mean_length")]:
        assert step_log[trl_key] == step_log[grpo_key], trl_key
    assert step_log["epoch"] == 0.5 and step_log["grpo_step"] == 1 and "step" not in step_log   # as transformers' on_log
    assert set(cb.logs[-1]) == {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                                "epoch"}
    assert cb.logs[-1]["train_loss"] == pytest.approx((cb.logs[0]["loss"] + cb.logs[1]["loss"]) / 2)
    # TrainOutput's fields, and its unpacking; metrics.jsonl keeps grpo's own keys only
    global_step, training_loss, metrics = result
    assert (global_step, result.global_step, result.steps) == (4, 4, 2) and training_loss == result.training_loss
    assert metrics["train_loss"] == training_loss and "reward/digits/mean" in metrics
    on_disk = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in on_disk] == [1, 2] and not {"loss", "reward", "epoch"} & set(on_disk[0])


def test_epochs_and_evaluation(tmp_path):
    cb = Every()
    t = trl_trainer(tmp_path, cb, max_steps=6, eval_dataset=ROWS[:4], **{"train.eval_steps": 2})
    t.train()
    names = [e[0] for e in cb.events]
    # 3 grpo steps of 8 prompts over 16: step 3 starts epoch 2 -> epoch end/begin before its first on_step_begin
    at = names.index("on_epoch_end")
    assert cb.events[at:at + 3] == [("on_epoch_end", 4, 1.0), ("on_epoch_begin", 4, 1.0), ("on_step_begin", 4, 1.0)]
    assert names.count("on_epoch_begin") == 2 and names.count("on_epoch_end") == 2
    assert names[names.index("on_evaluate") - 1] == "on_log" and names.count("on_evaluate") == 1   # after step 2
    assert cb.metrics[0]["epoch"] == 1.0 and "eval_rewards/digits/mean" in cb.metrics[0]
    assert t.state.log_history[1]["eval_rewards/digits/mean"] == cb.metrics[0]["eval_rewards/digits/mean"]


def test_trainer_callback_list_and_log(tmp_path):
    first, second = Every(), Recorder()
    t = trl_trainer(tmp_path, first)
    assert [e[0] for e in first.events] == ["on_init_end"]
    t.add_callback(second)
    t.add_callback(Every)                                   # a class: an instance is made, as in transformers
    assert t.pop_callback(Every) is first and t.pop_callback(first) is None
    t.remove_callback(Every)
    with pytest.raises(ValueError, match="remove_callback: Every is not one of this trainer's callbacks"):
        t.remove_callback(first)
    t.log({"custom": 1.0})                                  # transformers' Trainer.log: log_history and on_log
    assert t.state.log_history == [{"custom": 1.0, "epoch": 0, "step": 0}]
    t.train()
    assert second.events[:2] == [("log", 0, False, 1), ("begin", 0, 4)] and second.events[-1] == ("end", 4, True)
    assert [r["step"] for r in t.state.log_history[:2]] == [2, 4] and t.state.global_step == 4


def test_on_pre_optimizer_step_sees_the_clipped_gradients_before_they_are_applied(tmp_path):
    class Grads(TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
            self.seen.append((len(grads) > 0, norm, optimizer is not None))

    cb = Grads()
    trl_trainer(tmp_path, cb, max_steps=2, max_grad_norm=1e-3).train()
    assert len(cb.seen) == 2 and all(has and opt for has, _, opt in cb.seen)
    assert all(norm <= 1e-3 * (1 + 1e-6) for _, norm, _ in cb.seen)        # after clipping to max_grad_norm


class Requests(TrainerCallback):
    """Sets control.should_save / should_evaluate from on_step_end at chosen global steps, as users do."""

    def __init__(self, save_at=(), evaluate_at=()):
        self.save_at, self.evaluate_at, self.saves, self.evaluations = save_at, evaluate_at, [], []

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = state.global_step in self.save_at
        control.should_evaluate = state.global_step in self.evaluate_at

    def on_save(self, args, state, control, **kwargs):
        self.saves.append(state.global_step)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evaluations.append((state.global_step, "eval_rewards/digits/mean" in metrics))


def test_should_save_and_should_evaluate_are_acted_on(tmp_path):
    cb = Requests(save_at={2}, evaluate_at={1})
    tok = build_tokenizer()
    config = {"max_steps": 3, "num_generations": 4, "max_completion_length": 6, "train.prompts_per_step": 2,
              "log.progress_bar": False, "cpu.num_threads": 1, "train.output_dir": str(tmp_path / "run"),
              "train.save_final": False}                       # save_steps 0 and eval_steps 0: only the requests
    grpo.Trainer(build_model(tok, "micro", seed=0), reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok,
                 config=config, callbacks=[cb], eval_dataset=ROWS[:4]).train()
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"] and cb.saves == [2]
    assert cb.evaluations == [(1, True)]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert ["eval/reward/digits" in r for r in records] == [True, False, False]


def test_a_save_request_of_an_earlier_update_survives_the_next_on_step_begin(tmp_path):
    # 2 optimizer updates per grpo step: the request at global step 1 is cleared from control by update 2's
    # on_step_begin, as in transformers, and still saves at the end of grpo step 1
    cb = Requests(save_at={1})
    trl_trainer(tmp_path, cb).train()
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-1"] and cb.saves == [2]


def test_should_evaluate_without_an_eval_set_does_nothing(tmp_path):
    cb = Requests(evaluate_at={1})
    trainer(tmp_path, cb).train()
    assert cb.evaluations == []
