"""TRL's extra reward keywords: trainer_state, log_metric, log_extra (grpo/rewards/context.py)."""

import json

import pytest

from grpo.rewards import RewardError, score
from grpo.rewards.context import RewardLog, TrainerState, context_kwargs, reward_context

PROMPTS, COMPLETIONS = ["p", "p", "q", "q"], ["a", "bb", "ccc", "dddd"]


def named(prompts, completions, trainer_state):
    return [float(trainer_state.global_step)] * len(completions)


def open_ended(completions, **kwargs):
    kwargs["trainer_state"].global_step = 99           # the run's state must not change
    for record in kwargs["trainer_state"].log_history:  # nor its history
        record["loss"] = 9.0
    kwargs["trainer_state"].log_history.append({})
    kwargs["log_metric"]("mean_len", sum(map(len, completions)) / len(completions))
    kwargs["log_extra"]("len", [len(c) for c in completions])
    return [1.0] * len(completions)


def plain(prompts, completions):
    return [0.5] * len(completions)


def test_each_function_gets_the_context_keywords_it_can_take():
    assert set(context_kwargs(open_ended)) == {"trainer_state", "log_metric", "log_extra"}
    assert set(context_kwargs(named)) == {"trainer_state"}
    assert context_kwargs(plain) == {}
    assert context_kwargs(len) == {}                   # no signature: nothing extra
    out = score([("named", named), ("open", open_ended), ("plain", plain)], None, PROMPTS, COMPLETIONS, {})
    assert out.per_function[:, 0].tolist() == [0.0] * 4 and out.per_function[:, 2].tolist() == [0.5] * 4


def test_state_and_logs_inside_a_step_context():
    state = TrainerState(global_step=4, max_steps=10, epoch=2.0, log_history=[{"loss": 0.5, "step": 4}])
    with reward_context(state) as log:
        out = score([("named", named), ("open", open_ended)], None, PROMPTS, COMPLETIONS, {})
        score([("open", open_ended)], None, PROMPTS[:2], COMPLETIONS[:2], {})
    assert out.per_function[:, 0].tolist() == [4.0] * 4
    assert state.global_step == 4                      # open_ended changed its copy only
    assert state.log_history == [{"loss": 0.5, "step": 4}]
    metrics, columns = log.finish({"mean_len": 1.0}, count=2)
    assert metrics == {"reward_log/mean_len": pytest.approx((2.5 + 1.5) / 2)}   # taken by the trainer: renamed
    assert columns == {"len": [1, 2]}                  # the last call's column, one value per completion
    metrics, columns = log.finish({}, count=4)
    assert metrics == {"mean_len": 2.0, "reward_log/extra_dropped": 1} and columns == {}


def test_outside_a_step_rewards_see_step_0_and_their_logs_go_nowhere():
    out = score([("named", named), ("open", open_ended)], None, PROMPTS, COMPLETIONS, {})
    assert out.per_function[:, 0].tolist() == [0.0] * 4


def test_a_bad_logged_value_is_an_error_of_that_reward():
    def bad(completions, log_metric, **kw):
        log_metric("x", float("nan"))
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match="reward function 'bad'.*log_metric\\('x', ...\\): the value must be a finite"):
        score([("bad", bad)], None, PROMPTS, COMPLETIONS, {})
    with pytest.raises(TypeError, match="the column must be a non-empty string"):
        RewardLog().log_extra("", [1])


def test_per_completion_recalls_after_a_failing_batch_log_nothing():
    def flaky(completions, log_metric, **kw):
        log_metric("calls", 1.0)
        if "bb" in completions:
            raise RuntimeError("cannot score bb")
        return [1.0] * len(completions)

    with reward_context(TrainerState()) as log:
        out = score([("flaky", flaky)], None, PROMPTS, COMPLETIONS, {}, on_error="zero")
    assert out.per_function[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]   # found by the per-completion calls
    assert log.finish({}, 4)[0] == {"calls": 1.0} and log.values == {"calls": [1.0]}


def test_training_passes_the_progress_and_writes_the_logs(tmp_path):
    from tests.run_helpers import make_micro_dir, run_in_process, tiny_config

    reward = tmp_path / "curriculum.py"
    reward.write_text("def curriculum(completions, trainer_state, log_metric, log_extra, **kw):\n"
                      "    frac = trainer_state.global_step / trainer_state.max_steps\n"
                      "    log_metric('curriculum/frac', frac)\n"
                      "    log_extra('chars', [len(c) for c in completions])\n"
                      "    return [frac * sum(ch.isdigit() for ch in c) for c in completions]\n")
    out = tmp_path / "run"
    flat = tiny_config(make_micro_dir(tmp_path / "m"), f"{reward}:curriculum", out, **{
        "train.max_steps": 3, "train.save_steps": 0, "log.samples_per_step": 2})
    run_in_process(flat)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["curriculum/frac"] for r in records] == pytest.approx([0.0, 1 / 3, 2 / 3])
    assert records[0]["reward/curriculum/mean"] == 0.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["extra"]["chars"] == len(s["completion"]) for s in samples)
