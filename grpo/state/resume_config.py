"""Config changes between a run and its resumption: applied, or refused with an error naming the key.

Resuming restores every state from the checkpoint; a changed setting must then either reach the
restored state or stop the run, never be listed as changed while the old value stays in force.

* **Refused** (:data:`REFUSED`, a ConfigError naming the key, before anything is written): keys
  whose old value is baked into the checkpoint: the model the weights were trained from
  (``model.path``), the shape and scale of the LoRA adapter (``lora.enabled``, ``lora.r``,
  ``lora.alpha``, ``lora.target_modules``), the seed (the prompt order continues from its saved
  state while sampling, keyed by the seed, would not: a mix of two runs), and a refreshed reference policy the checkpoint does
  not hold (``algorithm.ref_update_steps`` / ``algorithm.beta`` turned on).
* **Applied** (warned about, with each key): everything else. The optimizer's settings are read back
  from the checkpoint, so :func:`apply_optimizer_settings` puts the run's ``optim.lr``,
  ``optim.adam_beta1/2`` and ``optim.weight_decay`` into the restored optimizer and scheduler; the
  schedule (``optim.warmup_steps``, ``optim.lr_scheduler``, ``train.max_steps``) is rebuilt from the
  config and continues from the checkpoint's position. ``rollout.num_generations`` and the other
  sampling, reward, loss and data keys simply hold from the next step on: no rollouts are buffered
  across a checkpoint, so none were generated under the old values (a changed number of prompts
  is still refused by the data stream, grpo/data/prompts.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo.config import Config, ConfigError, to_dict
from grpo.config.aliases import rewrite_tree
from grpo.config.variants import nested_saved

#: Keys whose change cannot apply to a checkpoint, with the reason.
REFUSED: dict[str, str] = {
    "model.path": "the checkpoint's weights and the reference policy belong to the model it was trained from "
                  "(to train from this checkpoint with another model, start a new run)",
    "lora.enabled": "the checkpoint holds full weights or an adapter, not the other",
    "lora.r": "the adapter in the checkpoint has the old rank",
    "lora.alpha": "the adapter's update is scaled by lora.alpha / lora.r: a new alpha changes the trained policy",
    "lora.target_modules": "the adapter in the checkpoint covers the old modules",
    "train.seed": "the prompt order continues from the checkpoint's state, while the sampling (keyed by the seed) "
                  "would follow the new seed: a mix of two runs",
}


#: The adapter keys of REFUSED: without LoRA (lora.enabled false before and now) there is no adapter they describe,
#: so their change applies (to nothing) instead of being refused.
NO_ADAPTER_KEYS = ("lora.r", "lora.alpha", "lora.target_modules")


def flat_config(tree: dict[str, Any]) -> dict[str, Any]:
    """{'train': {'seed': 0}} -> {'train.seed': 0}, JSON-normalised (tuples as lists) like a saved config; the
    variant keys nested (`algorithm.policy_loss: {name, ...}`) whether saved flat (older runs) or nested; the CPU
    runtime's keys under `cpu` whether saved under their old names (train.num_threads, ...) or not."""
    tree = rewrite_tree(nested_saved(json.loads(json.dumps(tree, default=str))), quiet=True)
    return {f"{section}.{key}": value for section, values in tree.items() if isinstance(values, dict)
            for key, value in values.items()}


def refused_change(saved: dict[str, Any], cfg: Config, checkpoint: Path) -> str | None:
    """Why `cfg` cannot resume `checkpoint` (saved with config `saved`), naming the key; None: it can."""
    old, new = flat_config(saved), flat_config(to_dict(cfg))
    for key, why in REFUSED.items():
        if key in old and old[key] != new.get(key):     # a key the checkpoint predates is not a change
            if key in NO_ADAPTER_KEYS and not old.get("lora.enabled") and not new.get("lora.enabled"):
                continue                                # no adapter (full weights): the key changes nothing
            return (f"cannot resume {checkpoint.name} with a changed {key} ({old[key]!r} -> {new.get(key)!r}): {why}; "
                    f"set it back, or start a new run (train.resume: never)")
    algo = cfg.algorithm
    needs_reference = algo.ref_update_steps > 0 and algo.beta > 0
    if needs_reference and not (checkpoint / "reference.safetensors").is_file():
        key = "algorithm.ref_update_steps" if not old.get("algorithm.ref_update_steps") else "algorithm.beta"
        return (f"cannot resume {checkpoint.name} with {key}={new.get(key)!r}: the checkpoint holds no refreshed "
                f"reference policy (written with {key}={old.get(key)!r}); set it back, or start a new run")
    return None


def refuse_changes(saved: dict[str, Any], cfg: Config, checkpoint: Path) -> None:
    """ConfigError naming the first changed key that cannot apply to `checkpoint`."""
    why = refused_change(saved, cfg, checkpoint)
    if why:
        raise ConfigError(why)


def apply_optimizer_settings(optimizer, scheduler, cfg: Config, saved: dict[str, Any]) -> None:
    """After the optimizer and scheduler states are loaded: the run's optim.* values replace the
    checkpoint's, and the learning rate is that of the run's schedule at the checkpoint's position.

    The schedule's position counts optimizer updates; with a changed ``algorithm.num_iterations`` or
    ``algorithm.mini_batches`` (updates per step) it is rescaled to the same step. Unchanged settings give back the very values
    the checkpoint holds (the same float operations as ``LambdaLR``), so an unchanged resume stays
    bit-identical.
    """
    oc, mu = cfg.optim, cfg.algorithm.updates_per_step
    flat = flat_config(saved)
    old_mu = (flat.get("algorithm.num_iterations") or cfg.algorithm.num_iterations) * (flat.get("algorithm.mini_batches") or 1)
    if old_mu != mu:
        scheduler.last_epoch = scheduler.last_epoch * mu // old_mu
    scheduler.base_lrs = [group.get("grpo_lr", oc.lr) for group in optimizer.param_groups]   # loss modules: own lr
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group.update(initial_lr=base, lr=base * factor(scheduler.last_epoch),
                     weight_decay=oc.weight_decay if "grpo_lr" not in group else 0.0,
                     betas=(oc.adam_beta1, oc.adam_beta2))
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]   # what get_last_lr() reports
