"""grpo/training/skeleton.py: the run skeleton that the text loop and the Flow-GRPO loop share. In both, a
signal or a callback ends the run after the current step with a checkpoint and `stopped_by`, and
`train.resume: auto` continues from that checkpoint to train.max_steps."""

from __future__ import annotations

import pytest

from grpo.config import build_config
from grpo.flow.loop import run_flow
from grpo.state.checkpoint import list_checkpoints, verify_checkpoint
from grpo.state.metrics import read_metrics
from grpo.training.callbacks import CallbackList
from grpo.training.skeleton import wants_checkpoint
from tests.kill_hook import killing_at
from tests.run_helpers import make_micro_dir, make_reward, tiny_config


@pytest.fixture(scope="module")
def text_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("skeleton")
    return make_micro_dir(root / "micro"), make_reward(root)


def run_text(env, out, callbacks=(), **over):
    """The text loop (grpo/training/loop.py): 4 steps of the micro model, a checkpoint every 3."""
    from grpo.api.trainer import Trainer

    flat = tiny_config(*env, out, **{"train.max_steps": 4, "train.save_steps": 3, **over})
    return Trainer(config=build_config(overrides=flat), callbacks=list(callbacks)).train()


def run_flow_loop(env, out, callbacks=(), **over):
    """The Flow-GRPO loop (grpo/flow/loop.py): 4 steps of a tiny MLP on the 2-D mixture, a checkpoint every 3."""
    flat = {"flow.task": "mixture", "flow.model": "", "flow.model_dim": 16, "flow.model_depth": 2,
            "flow.train_steps": 4, "flow.prompts_per_step": 4, "flow.micro_batch_size": 7, "flow.beta": 0.01,
            "rollout.num_generations": 4, "optim.lr": 1e-2, "train.max_steps": 4, "train.output_dir": str(out),
            "train.save_steps": 3, "log.progress_bar": False, **over}
    return run_flow(build_config(None, flat), callbacks=CallbackList(list(callbacks)))


LOOPS = {"text": run_text, "flow": run_flow_loop}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_signal_ends_the_run_after_the_step_with_a_checkpoint_that_resume_continues(loop, text_env, tmp_path):
    run, out = LOOPS[loop], tmp_path / "run"
    with killing_at("step:2:TERM"):                                # SIGTERM as step 2 ends
        stopped = run(text_env, out)
    assert (stopped.stopped_by, stopped.signum, stopped.steps) == ("SIGTERM", 15, 2)
    assert stopped.checkpoint == out / "checkpoint-2"              # not a save_steps step: saved for the stop
    verify_checkpoint(stopped.checkpoint)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    resumed = run(text_env, out, **{"train.resume": "auto"})
    assert (resumed.stopped_by, resumed.steps, resumed.checkpoint) == (None, 4, out / "checkpoint-4")
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]   # 3 and 4 added, 1-2 kept
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]


class StopAt:
    """A callback that asks to stop at `step` and notes the checkpoints it is told of."""

    def __init__(self, step: int):
        self.step, self.saved = step, []

    def on_step_end(self, step, metrics):
        return step == self.step

    def on_checkpoint(self, path):
        self.saved.append(path.name)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_callback_asking_to_stop_ends_the_run_with_a_checkpoint(loop, text_env, tmp_path):
    callback = StopAt(1)
    result = LOOPS[loop](text_env, tmp_path / "run", [callback])
    assert (result.stopped_by, result.signum, result.steps) == ("callback", 0, 1)
    assert callback.saved == ["checkpoint-1"] and result.checkpoint == tmp_path / "run" / "checkpoint-1"
    assert result.metrics["step"] == 1


def test_checkpoints_every_save_steps_and_at_the_end_with_save_final():
    tc = build_config(overrides={"train.max_steps": 7, "train.save_steps": 3}).train
    assert [s for s in range(1, 8) if wants_checkpoint(tc, s)] == [3, 6, 7]     # save_final: the last step too
