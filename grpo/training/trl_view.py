"""TRL's view of a grpo run: its step count, epochs, TrainingArguments names and log keys.

A grpo step is one generation batch. It does ``algorithm.updates_per_step`` optimizer updates
(num_iterations x mini_batches). TRL's ``TrainerState.global_step`` counts optimizer updates, so after grpo
step s TRL's global step is ``s x updates_per_step``. grpo/config/trl.py uses the same factor when it divides
TRL's max_steps. An epoch is one pass over the training prompts: ``epoch = prompts drawn / prompts``. This
agrees with TRL at every optimizer update, because TRL's sampler gives each generation batch
``prompts_per_step`` new prompts.

:class:`TrlProgress` holds these counters for one run. It also holds ``log_history``: each step's metrics
record with TRL's key names added next to grpo's (:func:`trl_logs`). It builds the ``trainer_state`` that
reward functions see (grpo/rewards/context.py) and feeds the Hugging Face callbacks (grpo/training/hf_callbacks.py).
metrics.jsonl keeps grpo's own keys: the aliases exist only in this view.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from grpo.rewards.context import TrainerState

#: grpo metric -> the name TRL's GRPOTrainer logs the same quantity under (grpo_trainer.py _generate_and_score
#: and _compute_loss; transformers' Trainer adds loss, grad_norm and learning_rate).
ALIASES = {
    "loss/total": "loss", "loss/policy": "policy_loss", "optim/grad_norm": "grad_norm", "optim/lr": "learning_rate",
    "reward/total/mean": "reward", "reward/total/std": "reward_std", "advantages/zero_std_frac": "frac_reward_zero_std",
    "kl/mean": "kl", "policy/entropy": "entropy", "completion/length_mean": "completions/mean_length",
    "completion/length_max": "completions/max_length", "completion/length_min": "completions/min_length",
    "completion/truncated_frac": "completions/clipped_ratio", "policy/clip_frac": "clip_ratio/region_mean",
    "policy/clip_low_frac": "clip_ratio/low_mean", "policy/clip_high_frac": "clip_ratio/high_mean",
}
_REWARD = re.compile(r"reward/(.+)/(mean|std)")


def trl_name(key: str) -> str | None:
    """TRL's name for grpo's metric `key`, or None when TRL has none. ``reward/<fn>/mean`` becomes
    ``rewards/<fn>/mean``. The held-out evaluation's ``eval/<x>`` becomes ``eval_<x>``, with
    ``eval/reward/<fn>`` as ``eval_rewards/<fn>/mean``."""
    if key in ALIASES:
        return ALIASES[key]
    if key.startswith("eval/"):
        rest = key[len("eval/"):]
        return f"eval_rewards/{rest[len('reward/'):]}/mean" if rest.startswith("reward/") else f"eval_{rest}"
    match = _REWARD.fullmatch(key)
    return f"rewards/{match[1]}/{match[2]}" if match and match[1] != "total" else None


def trl_logs(record: dict[str, Any]) -> dict[str, Any]:
    """`record` (grpo's keys) plus TRL's names for the same values; grpo's keys win no clash (there is none)."""
    aliases = {}
    for key, value in record.items():
        name = trl_name(key)
        if name is not None and name not in record:
            aliases[name] = value
    return {**record, **aliases}


@dataclasses.dataclass(frozen=True)
class TrainingArgumentsView:
    """The TrainingArguments / GRPOConfig fields TRL callbacks and reward functions read, under their names, in
    TRL's units (:func:`training_arguments` fills them from grpo's config). Read-only: a callback that changes
    them would not change the run."""

    output_dir: str
    overwrite_output_dir: bool
    seed: int
    max_steps: int
    num_train_epochs: int | None
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    generation_batch_size: int
    num_generations: int
    num_iterations: int
    max_completion_length: int
    temperature: float
    top_p: float
    beta: float
    epsilon: float
    epsilon_high: float
    learning_rate: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    max_grad_norm: float
    warmup_steps: int
    lr_scheduler_type: str
    logging_steps: int
    save_steps: int
    eval_steps: int
    save_strategy: str
    eval_strategy: str
    save_total_limit: int | None
    bf16: bool
    fp16: bool
    gradient_checkpointing: bool
    report_to: list[str]
    run_name: str | None
    disable_tqdm: bool
    world_size: int
    push_to_hub: bool = False
    logging_strategy: str = "steps"            # a log record every grpo step (logging_steps updates)
    logging_first_step: bool = False
    eval_delay: float = 0
    load_best_model_at_end: bool = False
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (TrainingArguments.to_dict: what the trackers' callbacks log)."""
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def training_arguments(cfg: Any, world_size: int = 1, num_train_epochs: int | None = None) -> TrainingArgumentsView:
    """The TrainingArguments / GRPOConfig fields TRL users read, with values derived from grpo's config. TRL
    counts steps in optimizer updates, so max_steps, save_steps, eval_steps and warmup_steps are given in
    updates. per_device_train_batch_size x gradient_accumulation_steps x world_size is the number of
    completions in one update. ``train.micro_batch_size: 0`` (no row limit) counts as a whole update.
    `num_train_epochs`: None until the prompt count is known (:class:`TrlProgress` gives it)."""
    tc, algo, rollout, optim = cfg.train, cfg.algorithm, cfg.rollout, cfg.optim
    per_update = max(1, tc.prompts_per_step * rollout.num_generations // algo.mini_batches // max(1, world_size))
    per_device = tc.micro_batch_size if 0 < tc.micro_batch_size < per_update else per_update
    accumulation = max(1, math.ceil(per_update / per_device))
    u = algo.updates_per_step
    precision = tc.precision
    return TrainingArgumentsView(
        output_dir=str(tc.output_dir), overwrite_output_dir=tc.overwrite_output_dir, seed=tc.seed,
        max_steps=tc.max_steps * u, num_train_epochs=num_train_epochs,
        per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation * algo.mini_batches,
        generation_batch_size=tc.prompts_per_step * rollout.num_generations,
        num_generations=rollout.num_generations, num_iterations=algo.num_iterations,
        max_completion_length=rollout.max_new_tokens, temperature=rollout.temperature, top_p=rollout.top_p,
        beta=algo.beta, epsilon=algo.epsilon, epsilon_high=algo.epsilon_high or algo.epsilon,
        learning_rate=optim.lr, weight_decay=optim.weight_decay, adam_beta1=optim.adam_beta1,
        adam_beta2=optim.adam_beta2, max_grad_norm=optim.max_grad_norm, warmup_steps=optim.warmup_steps,
        lr_scheduler_type=optim.lr_scheduler,
        logging_steps=u, save_steps=tc.save_steps * u, eval_steps=tc.eval_steps * u,
        save_strategy="steps" if tc.save_steps else "no", eval_strategy="steps" if tc.eval_steps else "no",
        save_total_limit=tc.save_total_limit or None, bf16=precision == "bf16", fp16=precision == "fp16",
        gradient_checkpointing=bool(tc.gradient_checkpointing), report_to=list(cfg.log.report_to),
        run_name=cfg.log.run_name or None, disable_tqdm=not cfg.log.progress_bar, world_size=world_size,
        push_to_hub=False)


class TrlProgress:
    """TRL's counters of one run: optimizer updates, epochs and the TRL-keyed ``log_history``.

    Args:
        cfg: the run's Config.
        num_prompts: training prompts (an epoch); 0: unknown (no epochs).
        history: the metrics records of the steps done before this run (a resumed run), grpo's keys.
        is_main: this process is rank 0 (``is_world_process_zero``).
    """

    def __init__(self, cfg: Any, num_prompts: int, history: list[dict[str, Any]] = (), is_main: bool = True,
                 world_size: int = 1):
        self.cfg, self.num_prompts, self.is_main = cfg, num_prompts, is_main
        self.updates_per_step = cfg.algorithm.updates_per_step
        self.args = training_arguments(cfg, world_size, num_train_epochs=self.num_train_epochs)
        self.log_history: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}                 # the entry of the newest step (log_history may grow beside it)
        self.losses: list[float] = []                  # this session's per-step losses (TrainOutput.training_loss)
        self.session: list[int] = []                   # the grpo steps this session ran
        for record in history:
            self.log(record, session=False)

    @property
    def max_steps(self) -> int:
        return self.cfg.train.max_steps * self.updates_per_step

    @property
    def num_train_epochs(self) -> int:
        """Epochs the run touches, as transformers counts them for max_steps (ceil); 0 when unknown."""
        drawn = self.cfg.train.max_steps * self.cfg.train.prompts_per_step
        return math.ceil(drawn / self.num_prompts) if self.num_prompts else 0

    def global_step(self, step: int) -> int:
        """Optimizer updates done after grpo step `step`."""
        return step * self.updates_per_step

    def epoch(self, step: int) -> float:
        """Epochs done after grpo step `step` (prompts drawn / prompts)."""
        return step * self.cfg.train.prompts_per_step / self.num_prompts if self.num_prompts else 0.0

    def reward_state(self, step: int) -> TrainerState:
        """What a reward function sees while step `step` (1-based) is scored: TRL's state before its first update."""
        tc, u = self.cfg.train, self.updates_per_step
        return TrainerState(global_step=self.global_step(step - 1), max_steps=self.max_steps,
                            epoch=self.epoch(step - 1), num_train_epochs=self.num_train_epochs, logging_steps=u,
                            eval_steps=tc.eval_steps * u, save_steps=tc.save_steps * u,
                            train_batch_size=self.args.per_device_train_batch_size, log_history=self.log_history,
                            is_local_process_zero=self.is_main, is_world_process_zero=self.is_main)

    def log(self, record: dict[str, Any], session: bool = True) -> dict[str, Any]:
        """Add a step's metrics record to ``log_history`` as TRL would log it: grpo's keys, TRL's names,
        ``epoch`` and ``step``. ``step`` is TRL's global step; grpo's step is kept as ``grpo_step``."""
        step = int(record.get("step", 0))
        entry = {**trl_logs(record), "epoch": self.epoch(step), "grpo_step": step, "step": self.global_step(step)}
        self.log_history.append(entry)
        self.last = entry
        if session:
            self.session.append(step)
            if isinstance(record.get("loss/total"), (int, float)) and math.isfinite(record["loss/total"]):
                self.losses.append(float(record["loss/total"]))
        return entry

    def train_metrics(self, done: int, wall_s: float) -> dict[str, float]:
        """TRL's end-of-training summary (``TrainOutput.metrics``, the last ``on_log``) after grpo step `done`."""
        steps, wall = len(self.session), max(wall_s, 1e-9)
        completions = steps * self.cfg.train.prompts_per_step * self.cfg.rollout.num_generations
        return {"train_runtime": wall_s, "train_samples_per_second": completions / wall,
                "train_steps_per_second": steps * self.updates_per_step / wall, "train_loss": self.training_loss(),
                "epoch": self.epoch(done)}

    def training_loss(self) -> float:
        """The mean loss of this session's steps (TRL's ``TrainOutput.training_loss``); 0.0 when none ran."""
        return sum(self.losses) / len(self.losses) if self.losses else 0.0
