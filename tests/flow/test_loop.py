"""The Flow-GRPO loop on the 2-D mixture task with a tiny MLP: it trains, resumes exactly, survives
torch.set_default_device("meta"), and refuses bad settings with a message naming the key."""

import json

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.flow.loop import run_flow
from grpo.flow.models import load_flow_model
from grpo.state.metrics import read_metrics


def _cfg(out, **over):
    flat = {"flow.task": "mixture", "flow.model": "", "flow.model_dim": 16, "flow.model_depth": 2,
            "flow.train_steps": 4, "flow.prompts_per_step": 4, "flow.micro_batch_size": 7, "flow.beta": 0.01,
            "rollout.num_generations": 4, "optim.lr": 1e-2, "train.max_steps": 4, "train.output_dir": str(out),
            "train.save_steps": 2, "log.progress_bar": False, **over}
    return build_config(None, flat)


def test_trains_logs_checkpoints_and_changes_the_weights(tmp_path):
    cfg = _cfg(tmp_path / "run")
    torch.manual_seed(cfg.train.seed)
    from grpo.flow.loop import load_model
    from grpo.flow.tasks import TASKS

    initial = {k: v.clone() for k, v in load_model(cfg, TASKS["mixture"], torch.device("cpu")).state_dict().items()}
    result = run_flow(cfg)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for key in ("reward/total/mean", "kl/mean", "loss/policy", "policy/clip_frac", "optim/grad_norm", "flow/diversity"):
        assert all(key in r for r in records), key
    assert records[0]["flow/trained_steps"] == 3                  # 4 steps, the last one ODE
    assert records[-1]["kl/mean"] > 0                             # the policy moved away from the reference
    changed = [k for k, v in result.model.state_dict().items() if not torch.equal(v, initial[k])]
    assert changed
    saved = load_flow_model(tmp_path / "run" / "checkpoint-4")
    assert all(torch.equal(saved.state_dict()[k], v) for k, v in result.model.state_dict().items())
    assert json.loads((tmp_path / "run" / "checkpoint-4" / "labels.json").read_text())["vocab"] == [4]


def test_resume_from_step_two_equals_four_straight_steps(tmp_path):
    straight = run_flow(_cfg(tmp_path / "a"))
    run_flow(_cfg(tmp_path / "b", **{"train.max_steps": 2}))
    resumed = run_flow(_cfg(tmp_path / "b", **{"train.resume": "auto"}))
    for k, v in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k
    a, b = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert ra["reward/total/mean"] == rb["reward/total/mean"] and ra["loss/total"] == rb["loss/total"]


@pytest.mark.parametrize("variant", ["flow_grpo", "dance_grpo", "mix_grpo", "flow_grpo_fast"])
def test_trains_with_the_default_device_on_meta(tmp_path, variant):
    """Every tensor of a step is created on the model's device: a meta default device breaks nothing."""
    over = {"flow.variant": variant, "flow.guidance_scale": 2.0, "train.max_steps": 2}
    if variant == "dance_grpo":
        over["flow.beta"] = 0.0
    cfg = _cfg(tmp_path / variant, **over)
    from grpo.flow.loop import load_model
    from grpo.flow.tasks import TASKS

    model = load_model(cfg, TASKS["mixture"], torch.device("cpu"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.set_default_device("meta")
    try:
        result = run_flow(cfg, model)
    finally:
        torch.set_default_device(None)
    assert all(p.device.type == "cpu" for p in result.model.parameters())
    assert any(not torch.equal(v, before[k]) for k, v in result.model.state_dict().items())
    assert all(torch.isfinite(torch.tensor(r["loss/total"])) for r in read_metrics(tmp_path / variant / "metrics.jsonl"))


@pytest.mark.parametrize("over, message", [
    ({"flow.variant": "nope"}, "flow.variant must be one of"),
    ({"flow.task": "nope"}, "flow.task must be one of"),
    ({"flow.reward": "nope"}, "flow.reward must be one of"),
    ({"flow.variant": "dance_grpo", "flow.beta": 0.1}, "flow.beta must be 0 with flow.variant=dance_grpo"),
])
def test_bad_registry_names_are_refused_naming_the_key(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message):
        run_flow(_cfg(tmp_path / "x", **over))
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


@pytest.mark.parametrize("key, value, message", [
    ("flow.noise_level", -1, "flow.noise_level must be >= 0"),
    ("flow.train_steps", 1, "flow.train_steps must be >= 2"),
    ("flow.logprob_reduction", "max", "flow.logprob_reduction must be mean or sum"),
    ("flow.std", "batch", "flow.std must be group or global"),
    ("flow.nope", 1, "unknown config key 'flow.nope'"),
])
def test_bad_values_are_refused_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        build_config(None, {key: value})


def test_a_missing_model_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a flow model directory"):
        run_flow(_cfg(tmp_path / "y", **{"flow.model": str(tmp_path / "missing")}))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_model_device_is_honoured_for_a_model_built_by_the_loop(tmp_path):
    """model.device places a model the loop builds (auto: CUDA when available): cuda here is refused by name,
    before anything is written."""
    with pytest.raises(ConfigError, match="model.device=cuda:0: CUDA is not available"):
        run_flow(_cfg(tmp_path / "z", **{"model.device": "cuda"}))
    assert not (tmp_path / "z" / "metrics.jsonl").exists()


def test_the_update_reads_its_statistics_once_per_optimizer_step(tmp_path):
    """The loss statistics are summed on the device over micro-batches and read once per optimizer step (each
    read of a device value stalls the host on a GPU): the scalar reads made by grpo/flow/update.py and
    objective.py do not grow when the same pairs are split into more micro-batches."""
    from tests.conftest import ScalarReads

    reads, losses = {}, {}
    for mb in (2, 1000):
        with ScalarReads("flow/update.py", "flow/objective.py") as counted:
            run_flow(_cfg(tmp_path / str(mb), **{"flow.micro_batch_size": mb, "train.max_steps": 1}))
        reads[mb] = counted.count
        losses[mb] = read_metrics(tmp_path / str(mb) / "metrics.jsonl")[0]["loss/total"]
    assert reads[2] == reads[1000], reads
    assert losses[2] == pytest.approx(losses[1000], rel=1e-5)
