"""The Python API: ``grpo.Trainer``. The command line is a thin layer over it (one path, not two).

    import grpo

    def accuracy(completions, solution, **kwargs):         # TRL's reward signature, called by keyword
        return [float(c.strip() == s) for c, s in zip(completions, solution)]

    trainer = grpo.Trainer("./my-model", reward_funcs=[accuracy, ("format", 0.5)],
                           train_dataset=[{"prompt": "2+2=", "solution": "4"}, ...],
                           config={"learning_rate": 1e-6, "num_generations": 8, "max_steps": 100})
    result = trainer.train()                               # model, steps, output_dir, checkpoint, metrics
    trainer.evaluate(eval_rows)                            # {"accuracy": ..., "format": ..., ...}

See docs/python-api.md for every argument; grpo/api/inputs.py turns them into the loop's objects.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from grpo.training.callbacks import CallbackList
from grpo.config import Config
from grpo.api.dataset_check import check_prompt_column, stream_rows
from grpo.api.inputs import (config_for_rewards, peft_overrides, resolve_config, resolve_dataset, resolve_model,
                             resolve_rewards)
from grpo.training.runtime import build_runtime


class Trainer:
    """GRPO on a model, a prompt dataset and reward functions (the argument order of TRL's GRPOTrainer).

    Args:
        model: a local Hugging Face model directory, a loaded ``PreTrainedModel`` or a peft model (None:
            ``model.path`` of the config, or the embedded base policy). ``model.dtype``, ``lora.*``,
            ``model.attn_implementation`` and ``model.device`` apply to it.
        reward_funcs: a list of callables (``fn(prompts=, completions=, completion_ids=, **columns)``,
            sync or async), built-in names (``"accuracy"``, ``"cosine_length:max_len=512"``),
            ``"file.py:function"``, reward-model directories or loaded ``...ForSequenceClassification`` models,
            ``(fn, weight)``, ``(name, fn)`` or
            ``(name, fn, weight)`` tuples. Metrics are named after ``__name__`` or the given name.
            None: ``reward.functions`` of the config.
        config: a :class:`grpo.config.Config`, a YAML path, or a dict of sections, ``section.key`` keys
            and/or TRL GRPOConfig keys (``learning_rate``, ``num_generations``, ``beta``, ...).
            ``args=`` is accepted as an alias (TRL's name).
        train_dataset / eval_dataset: a dataset path, a ``datasets.Dataset`` (or ``DatasetDict``:
            ``data.split``), a list of dicts or a dict of columns; a ``prompt`` column (string or chat
            messages), other columns reach the rewards by name. None: ``data.dataset``, or the embedded task.
        tokenizer: the tokenizer (or its directory); default: saved beside the model.
            ``processing_class=`` is accepted as an alias (TRL's name).
        callbacks: objects with ``on_step_end(step, metrics)``, ``on_checkpoint(path)``,
            ``on_train_end(result)`` (see grpo/training/callbacks.py); ``on_step_end`` returning True stops the run.
            transformers ``TrainerCallback`` objects get transformers' hooks (grpo/training/hf_callbacks.py).
        peft_config: a peft ``LoraConfig`` (TRL's argument): LoRA with its r, lora_alpha, lora_dropout and
            target_modules (None: peft's default for the model type); other fields set are errors.
        reward_processing_classes: the tokenizers of reward models passed as loaded ``...ForSequenceClassification``
            objects in reward_funcs (TRL's argument; default: the tokenizer saved beside each model).
        tools: functions the model may call (TRL's argument): episodes of a ``ToolEnv`` of them (docs/agents.md);
            their signatures and docstrings go to the chat template as tool schemas.
    """

    def __init__(self, model: Any = None, reward_funcs: Any = None, config: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, tokenizer: Any = None, callbacks: list | None = None, *,
                 args: Any = None, processing_class: Any = None, env: Any = None, peft_config: Any = None,
                 tools: list | None = None, reward_processing_classes: Any = None):
        if args is not None and config is not None:
            raise TypeError("give config= or its alias args=, not both")
        if tools is not None:                                # TRL's tools=: functions the model may call
            if env is not None:
                raise TypeError("give env= or tools= (a tool-calling environment of those functions), not both")
            from grpo.envs.environment import ToolEnv

            env = ToolEnv(tools=list(tools))
        if processing_class is not None and tokenizer is not None:
            raise TypeError("give tokenizer= or its alias processing_class=, not both")
        config, tokenizer = config if args is None else args, tokenizer if processing_class is None else processing_class
        world = int(os.environ.get("WORLD_SIZE", "1"))
        cfg, config_weights = config_for_rewards(config, reward_funcs, world)   # weights count against reward_funcs
        if type(train_dataset).__name__ == "IterableDataset" and cfg.data.shuffle:
            print("grpo: train_dataset is an IterableDataset: its rows keep the stream's order, as in TRL "
                  "(data.shuffle false)", file=sys.stderr)
            cfg = resolve_config(cfg, {"data.shuffle": False})
        train_dataset, eval_dataset = (stream_rows(train_dataset, "train_dataset", cfg),   # TRL's IterableDataset:
                                       stream_rows(eval_dataset, "eval_dataset", cfg))     # the rows the run draws
        self.records, dataset_path = resolve_dataset(train_dataset, cfg.data.split)
        overrides = {"data.dataset": dataset_path} if dataset_path else {}
        if isinstance(model, (str, os.PathLike)):
            overrides["model.path"] = str(model)
        cfg = resolve_config(cfg, overrides)
        if peft_config is not None:                          # TRL's peft_config= -> lora.*
            cfg = resolve_config(cfg, peft_overrides(peft_config, model_type(model, cfg)))
        check_prompt_column(cfg.data, self.records)         # column names only, before the model loads
        if reward_funcs is None and not cfg.reward.functions and not cfg.reward.process_functions:
            from grpo.data.tasks import default_reward_functions

            given = cfg.data.dataset or ("train_dataset (in memory)" if self.records is not None else None)
            cfg = resolve_config(cfg, {"reward.functions": default_reward_functions(cfg, given)})
        rewards, weights = resolve_rewards(reward_funcs, cfg, reward_processing_classes, config_weights)
        if reward_funcs is not None:       # config.yaml records the functions by name
            cfg = resolve_config(cfg, {"reward.functions": [n for n, _ in rewards], "reward.weights": weights})
        self.config: Config = cfg
        self.rewards = rewards
        self.eval_records, eval_path = resolve_dataset(eval_dataset, cfg.data.split, "eval_dataset")
        if eval_path:
            self.eval_records = _records_of_path(eval_path, cfg)
        from grpo.rewards import load_reward

        self.step_rewards = [load_reward(spec) for spec in cfg.reward.process_functions]
        self.env = None                                      # multi-turn episodes (docs/agents.md)
        if env is not None or cfg.rollout.env:
            from grpo.envs.environment import load_env

            self.env = load_env(env if env is not None else cfg.rollout.env, cfg.rollout.tool_timeout_s,
                                cfg.rollout.max_observation_chars)
        self.runtime = build_runtime(cfg)
        self.runtime.prepare_process()                       # CPU: threads, allocator; CUDA: set_device
        from grpo.rewards.reward_model import place_reward_models

        place_reward_models(self.rewards + self.step_rewards, self.runtime.device)
        from grpo.training.loop import seed_everything

        seed_everything(cfg.train.seed)                      # LoRA initialisation is seeded
        self.model, self.tokenizer = resolve_model(model, tokenizer, cfg, self.runtime)
        self.callbacks = CallbackList(callbacks, cfg)
        self.result = None
        self.callbacks.init_end(self.model, self.tokenizer)  # Hugging Face's on_init_end

    def train(self, resume_from_checkpoint: bool | str | None = None):
        """Run GRPO; returns a grpo.training.loop.TrainResult (model, tokenizer, steps, output_dir, checkpoint, metrics;
        and TRL's TrainOutput fields global_step and training_loss: ``global_step, training_loss, metrics = ...``).
        ``resume_from_checkpoint`` (TRL's): True continues from the newest valid checkpoint of the output
        directory, a path from that checkpoint (``train.resume`` auto / PATH); None / False: the config's."""
        from grpo.training.loop import Job, run

        if resume_from_checkpoint:
            self.config = resolve_config(self.config, {"train.resume": "auto" if resume_from_checkpoint is True
                                                       else str(resume_from_checkpoint)})
        job = Job(self.config, self.model, self.tokenizer, self.records, self.rewards, self.step_rewards,
                  self.runtime, self.callbacks, self.eval_records, self.env)
        self.result = run(job)
        self.config = job.cfg                                # train.num_train_epochs: max_steps as resolved
        return self.result

    def save_model(self, output_dir: str | os.PathLike | None = None) -> Path:
        """Save the policy (a LoRA run: its adapter, naming the base directory) and tokenizer in Hugging Face
        format to `output_dir` (default ``train.output_dir``), as TRL's ``save_model``; returns the directory."""
        from grpo.state.model_files import save_checkpoint_model

        model = self.result.model if self.result is not None else self.model
        return save_checkpoint_model(model, self.tokenizer, Path(output_dir or self.config.train.output_dir))

    @property
    def args(self) -> Config:
        """TRL's name for the resolved config (``trainer.config``)."""
        return self.config

    @property
    def processing_class(self) -> Any:
        """TRL's name for the tokenizer (``trainer.tokenizer``)."""
        return self.tokenizer

    @property
    def state(self) -> Any:
        """TRL's ``trainer.state``, a ``transformers.TrainerState`` counting optimizer updates as TRL does
        (``global_step``, ``max_steps``, ``epoch``, ``num_train_epochs``, ...). ``log_history`` holds every step's
        metrics record with TRL's names added (``loss``, ``reward``, ``rewards/<fn>/mean``, ``step`` = global step,
        grpo's ``grpo_step``). Before train(): the records of the output directory's metrics file."""
        hf = self.callbacks.hf
        if hf.progress is None and not hf.state.log_history:   # not trained here yet: what the directory holds
            from grpo.health.monitor import read_jsonl
            from grpo.training.trl_view import TrlProgress

            path = Path(self.config.train.output_dir) / self.config.log.metrics_file
            hf.state.log_history = TrlProgress(self.config, 0, read_jsonl(path)).log_history
            hf.state.global_step = hf.state.log_history[-1]["step"] if hf.state.log_history else 0
        return hf.state

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """transformers' ``Trainer.log``: add `logs` (with ``epoch``) to ``state.log_history`` under the current
        global step and call the TrainerCallbacks' ``on_log``. metrics.jsonl is not changed."""
        state = self.state
        logs = {**logs, "epoch": state.epoch} if state.epoch is not None else dict(logs)
        state.log_history.append({**logs, "step": state.global_step})
        self.callbacks.hf.event("on_log", logs=logs)

    def add_callback(self, callback: Any) -> None:
        """Add a callback (an instance or a TrainerCallback class), as transformers' ``add_callback``."""
        self.callbacks.add(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return a callback (an instance, or the first of a class); None when there is none."""
        return self.callbacks.pop(callback)

    def remove_callback(self, callback: Any) -> None:
        """Remove a callback (an instance, or the first of a class); an instance that is not there is an error."""
        if self.callbacks.pop(callback) is None and not isinstance(callback, type):
            raise ValueError(f"remove_callback: {type(callback).__name__} is not one of this trainer's callbacks")

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """Refused: grpo does not upload (TRL's ``push_to_hub``)."""
        raise NotImplementedError(
            "push_to_hub: grpo does not upload models; save with trainer.save_model(dir) and upload that directory "
            "yourself with huggingface_hub: HfApi().upload_folder(folder_path=dir, repo_id=...)")

    def stop(self) -> None:
        """Ask a running train() to stop after the current step, with a checkpoint (as on SIGINT)."""
        self.callbacks.request_stop()

    def evaluate(self, dataset: Any = None, *, max_new_tokens: int | None = None, temperature: float = 0.0,
                 num_problems: int = 256) -> dict[str, float]:
        """Mean of every reward function over `dataset` (default: eval_dataset; with neither and no training
        dataset, `num_problems` held-out problems of the embedded task), greedy by default; plus completion_length."""
        from grpo.data.prompts import load_prompts
        from grpo.training.evaluate import evaluate

        cfg = self.config
        records = self.eval_records
        if dataset is not None:
            records, path = resolve_dataset(dataset, cfg.data.split, "dataset")
            records = _records_of_path(path, cfg) if path else records
        if records is None:
            if self.records is not None or cfg.data.dataset:
                raise ValueError("evaluate(): no eval_dataset given (pass Trainer(eval_dataset=...) or evaluate(dataset))")
            from grpo.data.tasks import TASKS

            rows = TASKS[cfg.data.task].generate("test", num_problems, seed=cfg.train.seed)
        else:
            rows = load_prompts(cfg.data, cfg.train.seed, self.tokenizer, records=records).rows
        return evaluate(self.model, self.tokenizer, rows, self.rewards,
                        max_new_tokens=max_new_tokens or cfg.rollout.max_new_tokens, temperature=temperature,
                        seed=cfg.train.seed, timeout_s=cfg.reward.timeout_s, on_error=cfg.reward.reward_errors)


def model_type(model: Any, cfg: Config) -> str | None:
    """The transformers ``model_type`` of `model` (an object, or a directory: its config.json; None: the
    config's ``model.path`` or the embedded policy); None when it cannot be read."""
    import json

    import torch

    from grpo.modeling.models import EMBEDDED_MODEL_DIR

    if isinstance(model, torch.nn.Module):
        return getattr(getattr(model, "config", None), "model_type", None)
    directory = Path(model if model is not None else (cfg.model.path or EMBEDDED_MODEL_DIR))
    try:
        return json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def _records_of_path(path: str, cfg: Config):
    """The rows of a dataset file, read with the config's split and bad-row policy."""
    from grpo.data.datasets_io import load_records

    return load_records(path, cfg.data.split, cfg.data.skip_bad_rows)


def train(cfg, model=None, tokenizer=None):
    """Run GRPO on `cfg` (a grpo.config.Config; model, data and rewards named in it; `model`/`tokenizer`
    objects replace `model.path`); returns a grpo.training.loop.TrainResult. The same path as
    ``grpo.Trainer(model, config=cfg).train()``."""
    return Trainer(model, tokenizer=tokenizer, config=cfg).train()
