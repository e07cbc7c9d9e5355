"""The GRPO loop: read it top to bottom. No math here; every stage is a function of its own.

    [resume: restore every state from a checkpoint] -> experience (sample, score, filter,
    advantages) -> update (mu times) -> reference refresh -> [reward-model retraining] -> metrics ->
    health rules (grpo/health/) and saved samples -> callbacks -> checkpoint

The loop receives resolved objects (a :class:`Job`: the placed policy, its tokenizer, the prompt
rows, the reward functions, the device runtime); grpo/api/trainer.py turns what a user gives (paths, dataset
objects, callables, TRL keys) into one. It never asks which device it runs on (grpo/training/runtime.py) nor
whether it is one process or many (grpo/training/world.py).

Reliability (docs/reliability.md): `train.resume` continues from the newest valid checkpoint
(grpo/state/resume.py); a first SIGINT/SIGTERM, or a callback asking to stop, finishes the step, saves and
returns (grpo/state/signals.py); steps with a non-finite loss are skipped and `train.max_bad_steps` in a
row stop the run without saving that state (grpo/training/guards.py). One run at a time holds output_dir (a
lock file, grpo/state/output_dir.py), and the directory is first changed once the first step has succeeded
(grpo.state.resume.begin_run). All of that around the step is the run skeleton Flow-GRPO shares
(grpo/training/skeleton.py). `emit` marks the named progress points (grpo/events.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.training.callbacks import CallbackList
from grpo.config import Config
from grpo.config.build import with_epochs
from grpo.data.prompts import PromptStream, load_prompts
from grpo.training.experience import ExperienceInputs, make_experience
from grpo.state.output_dir import OutputDirLock, prepare_output_dir
from grpo.training.evaluate import eval_metrics, eval_rows
from grpo.training.guards import deterministic_mode
from grpo.training.reward_model_updates import build_extras
from grpo.training.loss_modules import (build_entropy_control, build_learnable_losses, entropy_control_of,
                                         token_preference_of)
from grpo.training.critic import build_critics, critic_of
from grpo.state.metrics import step_metrics
from grpo.modeling.precision import autocast, autocast_dtype
from grpo.modeling.reference import build_reference
from grpo.state.resume import TrainState, begin_run
from grpo.training.run_checks import check_run, longest_prompt
from grpo.events import emit
from grpo.state.samples import SAMPLES_FILE, pick_samples, write_samples
from grpo.rewards.context import reward_context
from grpo.training.skeleton import Run, resume, wants_checkpoint  # noqa: F401  (wants_checkpoint: its old home)
from grpo.types import TrainBatch
from grpo.training.update import UpdateSettings, UpdateStats, build_optimizer, policy_update
from grpo.training.world import init_world
from grpo.training.trl_view import TrlProgress
from grpo.rollout.engine import build_engine
from grpo.health.monitor import read_jsonl


@dataclass
class TrainResult:
    model: torch.nn.Module
    tokenizer: Any
    steps: int                        # the last step done (max_steps unless stopped early)
    output_dir: Path
    checkpoint: Path | None           # the newest checkpoint of the run (what --resume continues)
    wall_s: float
    stopped_by: str | None = None     # "SIGINT" / "SIGTERM" / "callback" / "health" when the run ended early
    signum: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)   # the last step's metrics record
    global_step: int = 0              # TRL's count: optimizer updates done (steps x algorithm.updates_per_step)
    training_loss: float = 0.0        # TRL's: the mean loss of this session's steps

    def __iter__(self):
        """``global_step, training_loss, metrics = trainer.train()``, as TRL's TrainOutput unpacks."""
        return iter((self.global_step, self.training_loss, self.metrics))

    def __getitem__(self, i: int) -> Any:
        return tuple(self)[i]


@dataclass
class Job:
    """Everything one run needs, resolved (grpo.api.trainer.Trainer builds it)."""

    cfg: Config
    model: torch.nn.Module            # the policy, LoRA and dtype applied, placed by the runtime
    tokenizer: Any
    records: Any                      # grpo.data.datasets_io.Records of the training rows, or None: the embedded task
    rewards: list                     # [(name, fn)] outcome rewards
    step_rewards: list                # [(name, fn)] process (step) rewards
    runtime: Any                      # grpo.training.runtime.CpuRuntime | CudaRuntime
    callbacks: CallbackList = field(default_factory=CallbackList)
    eval_records: Any = None          # the API's eval_dataset (Records), for train.eval_steps
    env: Any = None                   # grpo.envs.EnvFactory: multi-turn episodes with tools (rollout.env)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (a resumed run then restores their saved states)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def mini_batches(batch: TrainBatch, k: int) -> list[TrainBatch]:
    """The step's batch in `k` equal, consecutive row ranges (whole groups: prompts_per_step splits into k), one
    optimizer update each (``algorithm.mini_batches``); k = 1: the batch itself."""
    n = batch.input_ids.shape[0]
    return [batch] if k == 1 else [batch.rows(slice(i * n // k, (i + 1) * n // k)) for i in range(k)]


def mean_stats(stats: list[UpdateStats]) -> dict[str, float]:
    """Average the update statistics of the mu optimizer steps of one generation batch."""
    fields = [f.name for f in dataclasses.fields(UpdateStats)]
    return {f: float(np.mean([float(getattr(s, f)) for s in stats])) for f in fields}


def update(state: TrainState, batch: TrainBatch, cfg: Config, step: int, world, plan) -> UpdateStats:
    """One optimizer update on the step's batch, as the memory plan says (grpo.training.memory_plan.MemoryPlan:
    micro-batch tokens, checkpointing, LM-head chunk); the `update` test hook fires after it."""
    policy, hooks = world.update_target()
    control = entropy_control_of(state.extras)                  # algorithm.entropy_control adaptive
    settings = UpdateSettings(temperature=cfg.rollout.temperature, micro_batch_size=cfg.train.micro_batch_size,
                              max_grad_norm=cfg.optim.max_grad_norm,
                              norm_length=cfg.algorithm.loss_norm_length or cfg.rollout.max_new_tokens,
                              logprob_chunk_size=plan.logprob_chunk_size,
                              gradient_checkpointing=plan.gradient_checkpointing,
                              micro_batch_tokens=plan.micro_batch_tokens, grad_buffer=plan.grad_buffer,
                              entropy_coef=control.applied() if control is not None else None,   # entropy control
                              parallel=hooks, preference=token_preference_of(state.extras))      # lambda-GRPO
    stats = policy_update(policy, state.optimizer, state.scheduler, batch, cfg.algorithm, settings)
    if control is not None and not stats.skipped:
        control.observe(stats.entropy)
    state.optimizer.zero_grad(set_to_none=True)   # not needed before the next update: out of the rollout's peak
    emit("update", step)
    return stats


def wants_eval_set(job: Job) -> bool:
    """Load the held-out rows: `train.eval_steps`, or an eval set that a TrainerCallback's
    control.should_evaluate may ask for."""
    has_set = bool(job.cfg.data.eval_dataset) or job.eval_records is not None
    return bool(job.cfg.train.eval_steps) or (has_set and job.callbacks.want_eval_set())


def initial_state(job: Job) -> tuple[TrainState, Any]:
    """The training state at step 0 and the prompt set (nothing written yet). With train.num_train_epochs, `job.cfg`
    gets the step count the training set's size gives (train.max_steps)."""
    prompt_set = load_prompts(job.cfg.data, job.cfg.train.seed, job.tokenizer, records=job.records,   # tokenized once
                              tools=job.env.tools if job.env is not None else None)
    job.cfg = with_epochs(job.cfg, len(prompt_set.rows))      # before the LR schedule is built from max_steps
    cfg, model, tc = job.cfg, job.model, job.cfg.train
    check_run(cfg, model, job.tokenizer, prompt_set.rows)       # vocabulary, positions, sampling: before any write
    fixed_ref = not cfg.algorithm.ref_update_steps              # a refreshed reference keeps float32 masters
    reference = build_reference(model, cfg.algorithm.beta,      # None when beta = 0
                                autocast_dtype(tc.precision) if fixed_ref else None,
                                offload=job.runtime.ref_offload(model),   # train.ref_offload: weights in a file
                                offload_dir=tc.output_dir)
    learnable = build_learnable_losses(cfg, model)              # lambda-GRPO's lambda: trained with the policy
    optimizer, scheduler = build_optimizer(model, cfg.optim, tc.max_steps * cfg.algorithm.updates_per_step,
                                           [x.param_group() for x in learnable])
    state = TrainState(model, job.tokenizer, optimizer, scheduler, reference,
                       PromptStream(prompt_set.rows, tc.seed, cfg.data.shuffle),
                       extras=[*learnable, *build_critics(cfg, model), *build_entropy_control(cfg)])   # value head
    return state, prompt_set


def run(job: Job) -> TrainResult:
    """Run GRPO up to `train.max_steps` (from a checkpoint with `train.resume`); write metrics.jsonl,
    config.yaml and checkpoints. A first SIGINT/SIGTERM, or a callback asking to stop, ends the run after
    the current step with a checkpoint. Under torchrun the run is data-parallel (grpo/training/world.py)."""
    world = init_world(job.cfg, job.runtime.device)
    created = not Path(job.cfg.train.output_dir).expanduser().exists()
    try:
        out = prepare_output_dir(job.cfg.train.output_dir)     # fails before anything is written
        try:
            with OutputDirLock(out, enabled=world.is_main):    # a second run on `out` is refused (rank 0 holds it)
                return _run(job, world, out)
        except BaseException:
            if created and world.is_main:                      # failed before writing anything (bad data, a bad
                with contextlib.suppress(OSError):             # reward): leave no empty directory behind
                    out.rmdir()                                # (rmdir removes only an empty one)
            raise
    finally:
        world.close()


def _run(job: Job, world, out: Path) -> TrainResult:
    start = time.perf_counter()
    cfg, runtime, callbacks = job.cfg, job.runtime, job.callbacks
    tc, algo = cfg.train, cfg.algorithm
    with deterministic_mode(tc.deterministic), contextlib.ExitStack() as stack:
        seed_everything(tc.seed)
        state, prompt_set = initial_state(job)
        cfg, tc = job.cfg, job.cfg.train                       # train.num_train_epochs: max_steps resolved
        state.extras += build_extras(cfg, job.rewards, world.world_size)  # reward.reward_model_update
        model, tokenizer = state.model, state.tokenizer
        held_out = eval_rows(cfg, tokenizer, job.eval_records) if wants_eval_set(job) else None   # checked before any write
        run_cfg = world.shard(state, cfg)                      # torchrun: this rank's share of the prompts
        ckpt = resume(state, cfg)                              # train.resume: never | auto | PATH
        world.prepare(state, cfg)
        engine = build_engine(run_cfg, model, tokenizer, runtime.device)   # rollout.engine: after restore, so a
        stack.callback(engine.close)                                       # vLLM engine starts from these weights
        run = Run(cfg, out, state, world, callbacks, ckpt)    # announce, health monitor (grpo/training/skeleton.py)
        world.barrier()
        plan = runtime.memory_plan(model, longest_prompt(prompt_set.rows), state.optimizer, engine.name)   # may refuse
        if world.is_main:
            print(f"grpo: {plan.describe()}", flush=True)   # once, at start (stdout: stderr is for errors)
            uncorrected = engine.name == "vllm" and cfg.algorithm.rollout_correction.name == "none"
            print(f"grpo: rollout engine {engine.name} (rollout.engine {cfg.rollout.engine})"
                  + ("; algorithm.rollout_correction none: sequence_mask is TRL's vLLM correction" if uncorrected
                     else ""), flush=True)
        budget = plan.logprob_tokens                           # tokens per no-grad pass (reference, old policy)
        progress = TrlProgress(cfg, len(prompt_set.rows), read_jsonl(out / cfg.log.metrics_file, run.first),  # TRL's
                               world.is_main, world.world_size)                                                  # counts
        callbacks.train_begin(state, progress, run.first)
        with run:                                              # metrics.jsonl, the graceful stop on SIGINT / SIGTERM
            for step in run.steps():
                runtime.reset_memory_stats()
                t0 = time.perf_counter()
                callbacks.step_begin(step)
                engine.wake()                                  # vLLM sleep mode: weights and KV cache back
                with reward_context(progress.reward_state(step)) as reward_log, autocast(runtime.device, tc.precision):   # train.precision
                    inputs = ExperienceInputs(model, tokenizer, job.rewards, job.step_rewards, state.reference,
                                              job.env, critic_of(state.extras), engine)
                    exp = make_experience(inputs, state.stream, run_cfg, runtime.device, max_tokens=budget)
                engine.sleep()                                 # vLLM sleep mode: its memory off the update's
                emit("rollout", step)
                runtime.release_memory()                       # cpu.malloc_trim: the rollout's heap holes off the update
                                                               # (once: a trim after the update cost 1-8 %, same peak)
                t1 = time.perf_counter()
                with autocast(runtime.device, tc.precision):     # backward runs outside it (grpo/training/update.py)
                    stats = [callbacks.update_end(step, update(state, part, cfg, step, world, plan))  # after each
                             for _ in range(algo.num_iterations)
                             for part in mini_batches(exp.batch, algo.mini_batches)]    # PPO epochs x mini-batches
                world.after_update(state)                      # FSDP2: new full weights into the rollout model
                engine.sync_weights(model)                     # vLLM: the updated weights in, prefix cache reset
                times = {"update_s": time.perf_counter() - t1, "step_s": time.perf_counter() - t0,
                         "experience_s": t1 - t0}
                if state.reference is not None and algo.ref_update_steps and step % algo.ref_update_steps == 0:
                    state.reference.refresh(model, algo.ref_mix_alpha)   # iterative GRPO: the reference follows
                extra = {k: v for x in state.extras for k, v in x.after_step(step, exp).items()}  # e.g. RM retraining
                record = {**step_metrics(step, world.view(exp), mean_stats(stats), times, prompt_set),
                          **runtime.memory_metrics(), **extra}
                logged, extra_columns = reward_log.finish(record, len(exp.groups.completions))  # log_metric, log_extra
                record.update(logged)
                asked_eval = callbacks.take_request("evaluate")   # a TrainerCallback's control.should_evaluate
                if held_out is not None and (asked_eval or tc.eval_steps and step % tc.eval_steps == 0) and world.is_main:
                    with reward_context(progress.reward_state(step + 1)):   # after the step's updates
                        record.update(eval_metrics(model, tokenizer, held_out, job.rewards, cfg))
                run.log(step, record)                          # health/<rule> levels, the metrics line
                progress.log(record)                           # log_history with TRL's names (rewards, HF callbacks)
                if world.is_main and cfg.log.samples_per_step:
                    write_samples(out / SAMPLES_FILE, pick_samples(step, exp, cfg.rollout.num_generations,
                                                                   cfg.log.samples_per_step, extra_columns))
                run.end_step(step, skipped=any(s.skipped for s in stats))   # alerts, callbacks, checkpoint or stop
        if tc.save_final and tc.max_steps == 0:
            if world.is_main:
                begin_run(out, cfg, ckpt)
            run.checkpoint = world.save(out, 0, state, cfg)
            callbacks.checkpoint(run.checkpoint)
    wall_s = time.perf_counter() - start
    done = run.done
    result = TrainResult(model, tokenizer, done, out, run.checkpoint, wall_s, run.stopped_by, run.signum,
                         {**run.record, **progress.train_metrics(done, wall_s)},   # + TRL's train_loss, train_runtime, ...
                         progress.global_step(done), progress.training_loss())
    callbacks.train_end(result)
    return result

