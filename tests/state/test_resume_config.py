"""Config changes on resume: applied to the restored state, or refused naming the key (grpo/state/resume_config.py)."""

from pathlib import Path

import pytest
import torch

from grpo.config import ConfigError, build_config, to_dict
from grpo.state.resume_config import NO_ADAPTER_KEYS, REFUSED, apply_optimizer_settings, refuse_changes, refused_change
from grpo.training.update import build_optimizer


def trained_state(flat: dict, updates: int) -> tuple[dict, dict]:
    """Optimizer and scheduler state dicts after `updates` steps under the config `flat` (a tiny linear model)."""
    cfg = build_config(overrides=flat)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer, scheduler = build_optimizer(model, cfg.optim, cfg.train.max_steps * cfg.algorithm.num_iterations)
    for _ in range(updates):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
    return optimizer.state_dict(), scheduler.state_dict()


def resumed(saved_flat: dict, flat: dict, updates: int):
    """A fresh optimizer/scheduler under `flat`, restored from a run under `saved_flat`, settings applied."""
    optim_state, sched_state = trained_state(saved_flat, updates)
    cfg = build_config(overrides=flat)
    torch.manual_seed(0)
    optimizer, scheduler = build_optimizer(torch.nn.Linear(3, 2), cfg.optim,
                                           cfg.train.max_steps * cfg.algorithm.num_iterations)
    optimizer.load_state_dict(optim_state)
    scheduler.load_state_dict(sched_state)
    apply_optimizer_settings(optimizer, scheduler, cfg, to_dict(build_config(overrides=saved_flat)))
    return optimizer, scheduler, optim_state


BASE = {"optim.lr": 0.01, "train.max_steps": 10}


def test_an_unchanged_config_gives_back_exactly_the_saved_values():
    flat = {**BASE, "optim.warmup_steps": 3, "optim.lr_scheduler": "cosine"}
    optimizer, scheduler, saved = resumed(flat, flat, 4)
    for group, old in zip(optimizer.param_groups, saved["param_groups"]):
        assert {k: group[k] for k in ("lr", "initial_lr", "betas", "weight_decay")} == {
            k: old[k] for k in ("lr", "initial_lr", "betas", "weight_decay")}


def test_a_new_lr_applies_at_the_resumed_position_of_the_schedule():
    optimizer, scheduler, _ = resumed({**BASE, "optim.lr_scheduler": "linear"},
                                      {**BASE, "optim.lr_scheduler": "linear", "optim.lr": 0.5}, 4)
    # linear decay over 10 updates, 4 done: factor 1 - 4/10 = 0.6 of the new peak 0.5
    assert scheduler.base_lrs == [0.5] and scheduler.last_epoch == 4
    lr = optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(0.3) and scheduler.get_last_lr() == [lr]
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * (1 - 5 / 10))


def test_new_warmup_betas_and_weight_decay_apply():
    optimizer, scheduler, _ = resumed(BASE, {**BASE, "optim.warmup_steps": 4, "optim.adam_beta1": 0.5,
                                             "optim.weight_decay": 0.1}, 2)
    group = optimizer.param_groups[0]
    # warm-up factor at update 2 of 4: (2 + 1) / (4 + 1)
    assert (group["lr"], group["betas"], group["weight_decay"]) == (pytest.approx(0.01 * 3 / 5), (0.5, 0.99), 0.1)


def test_a_new_num_iterations_rescales_the_schedule_position():
    flat = {**BASE, "optim.lr_scheduler": "linear"}
    optimizer, scheduler, _ = resumed(flat, {**flat, "algorithm.num_iterations": 2}, 4)   # 4 steps of 1 update
    assert scheduler.last_epoch == 8 and optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * (1 - 8 / 20))


@pytest.mark.parametrize("key,old,new", [
    ("model.path", "./a", "./b"), ("lora.enabled", False, True), ("lora.r", 16, 8), ("lora.alpha", 32, 16),
    ("lora.target_modules", ["all-linear"], ["q_proj"]), ("train.seed", 0, 1),
])
def test_changes_baked_into_the_checkpoint_are_refused_naming_the_key(tmp_path, key, old, new):
    lora = {"lora.enabled": True} if key in NO_ADAPTER_KEYS else {}           # an adapter these keys describe
    saved = to_dict(build_config(overrides={**lora, key: old}))
    with pytest.raises(ConfigError) as info:
        refuse_changes(saved, build_config(overrides={**lora, key: new}), tmp_path / "checkpoint-4")
    assert str(info.value) == (f"cannot resume checkpoint-4 with a changed {key} ({old!r} -> {new!r}): {REFUSED[key]}; "
                               f"set it back, or start a new run (train.resume: never)")


def test_changes_that_apply_are_not_refused(tmp_path):
    saved = to_dict(build_config())
    flat = {"optim.lr": 0.5, "rollout.num_generations": 4, "rollout.temperature": 0.7, "lora.dropout": 0.1,
            "algorithm.num_iterations": 2, "reward.functions": ["accuracy"], "model.dtype": "bfloat16"}
    assert refused_change(saved, build_config(overrides=flat), tmp_path) is None
    older = {s: {k: v for k, v in values.items() if k != "seed"} for s, values in saved.items()}
    assert refused_change(older, build_config(overrides={"train.seed": 3}), tmp_path) is None   # predates the key


def test_turning_on_the_reference_refresh_needs_a_saved_reference(tmp_path):
    saved = to_dict(build_config())
    cfg = build_config(overrides={"algorithm.ref_update_steps": 2})
    assert refused_change(saved, cfg, tmp_path) == (
        f"cannot resume {tmp_path.name} with algorithm.ref_update_steps=2: the checkpoint holds no refreshed reference "
        f"policy (written with algorithm.ref_update_steps=0); set it back, or start a new run")
    (tmp_path / "reference.safetensors").write_bytes(b"")
    assert refused_change(saved, cfg, Path(tmp_path)) is None


@pytest.mark.parametrize("key,old,new", [("lora.r", 16, 8), ("lora.alpha", 32, 16),
                                         ("lora.target_modules", ["all-linear"], ["q_proj"])])
def test_an_adapter_key_changed_on_a_run_without_lora_is_not_refused(tmp_path, key, old, new):
    """A full fine-tuning run (lora.enabled false before and now) has no adapter: the key changes nothing; with
    LoRA on, the same change is refused (the adapter in the checkpoint has the old shape or scale)."""
    saved = to_dict(build_config(overrides={key: old}))
    assert saved["lora"]["enabled"] is False
    assert refused_change(saved, build_config(overrides={key: new}), tmp_path / "checkpoint-38") is None
    with_lora = to_dict(build_config(overrides={key: old, "lora.enabled": True}))
    with pytest.raises(ConfigError, match=f"^cannot resume checkpoint-38 with a changed {key} "):
        refuse_changes(with_lora, build_config(overrides={key: new, "lora.enabled": True}), tmp_path / "checkpoint-38")
