"""The rules a built :class:`~grpo.config.Config` must satisfy across its keys (ranges, registry
names, combinations that cannot work). :func:`grpo.config.build_config` calls :func:`validate`
once; each failure is a one-line :class:`~grpo.config.ConfigError` that names the key."""

from __future__ import annotations

import math
import os

from grpo.config.engine import ENGINE_NAMES
from grpo.config.schema import ROLLOUT_PRECISIONS, Config, ConfigError

#: `log.report_to` names -> the package each needs (grpo.state.tracking holds their writers).
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def install_hint(name: str) -> str:
    """The one-line error for a tracker whose package is not installed."""
    package = TRACKER_PACKAGES[name]
    return f'log.report_to: {name} needs the {package} package: pip install -e ".[{name}]" (or pip install {package})'


def tracker_names(report_to: list[str]) -> list[str]:
    """The trackers of `log.report_to`, in order and without repeats (`none` = no tracker)."""
    return [name for name in dict.fromkeys(report_to) if name != "none"]


def report_to_problem(report_to: list[str]) -> str | None:
    """The one-line problem with `log.report_to` (unknown name, `none` mixed in, package missing), or None."""
    import importlib.util

    unknown = [name for name in report_to if name not in TRACKER_PACKAGES and name != "none"]
    if unknown:
        return f"log.report_to: unknown tracker {unknown[0]!r}; valid names: none, {', '.join(TRACKER_PACKAGES)}"
    if "none" in report_to and tracker_names(report_to):
        return "log.report_to: none cannot be combined with tracker names"
    for name in tracker_names(report_to):
        if importlib.util.find_spec(TRACKER_PACKAGES[name]) is None:   # checked without importing it
            return install_hint(name)
    return None


#: Files a run (or `grpo demo`) writes in its output directory beside metrics: no metrics file may take their names.
RUN_FILES = ("samples.jsonl", "alerts.jsonl", "summary.json")
#: The output directory's lock file (grpo.state.output_dir): no metrics file may take its name.
LOCK_FILE = ".grpo.lock"


def validate(cfg: Config) -> None:
    """Reject settings that cannot work, with a message naming the key."""
    from grpo.algorithms.advantages import REWARD_COMBINERS
    from grpo.algorithms.loss import AGGREGATIONS, IMPORTANCE_RATIOS, KL_ESTIMATORS
    from grpo.algorithms.stabilisers import KL_CORRECTION_LOG_RATIOS

    tracking = report_to_problem(cfg.log.report_to)       # unknown tracker or its package missing
    metrics_file = metrics_file_problem(cfg.log.metrics_file)
    rmu = cfg.reward.reward_model_update
    checks = [
        (cfg.rollout.num_generations >= 2, "rollout.num_generations must be >= 2: group-relative advantages need a group"),
        (cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1"),
        (cfg.rollout.temperature >= 0, "rollout.temperature must be >= 0"),
        (0 < cfg.rollout.top_p <= 1, "rollout.top_p must be in (0, 1]"),
        (0 <= cfg.rollout.min_p < 1, "rollout.min_p must be in [0, 1)"),
        (cfg.rollout.repetition_penalty > 0, "rollout.repetition_penalty must be > 0"),
        (cfg.rollout.repetition_penalty == 1.0 or not cfg.rollout.env,
         "rollout.repetition_penalty applies to single-turn rollouts; with rollout.env leave it at 1.0"),
        (cfg.rollout.top_k >= 0, "rollout.top_k must be >= 0"),
        (cfg.algorithm.epsilon >= 0, "algorithm.epsilon must be >= 0"),
        (cfg.algorithm.epsilon_high is None or cfg.algorithm.epsilon_high >= 0, "algorithm.epsilon_high must be >= 0"),
        (cfg.algorithm.beta >= 0, "algorithm.beta must be >= 0"),
        (cfg.algorithm.num_iterations >= 1, "algorithm.num_iterations must be >= 1"),
        (cfg.algorithm.mini_batches >= 1, "algorithm.mini_batches must be >= 1"),
        (cfg.algorithm.mini_batches == 1      # (the world size alone: grpo/training/distributed.py says so)
         or cfg.train.prompts_per_step % (cfg.algorithm.mini_batches * int(os.environ.get("WORLD_SIZE", "1"))) == 0,
         f"train.prompts_per_step ({cfg.train.prompts_per_step}) must split into algorithm.mini_batches "
         f"({cfg.algorithm.mini_batches}) equal parts on each of the {os.environ.get('WORLD_SIZE', '1')} processes"),
        (cfg.algorithm.loss_norm_length >= 0, "algorithm.loss_norm_length must be >= 0"),
        (cfg.algorithm.kl_estimator in KL_ESTIMATORS, f"algorithm.kl_estimator must be one of {sorted(KL_ESTIMATORS)}"),
        (cfg.algorithm.loss_agg_mode in AGGREGATIONS, f"algorithm.loss_agg_mode must be one of {sorted(AGGREGATIONS)}"),
        (cfg.algorithm.reward_combination in REWARD_COMBINERS,
         f"algorithm.reward_combination must be one of {sorted(REWARD_COMBINERS)}"),
        (cfg.algorithm.importance_sampling_level in IMPORTANCE_RATIOS,
         f"algorithm.importance_sampling_level must be one of {sorted(IMPORTANCE_RATIOS)}"),
        (cfg.algorithm.entropy_coef >= 0, "algorithm.entropy_coef must be >= 0"),
        (0 < cfg.algorithm.top_entropy_rho <= 1, "algorithm.top_entropy_rho must be in (0, 1]"),
        (cfg.algorithm.kl_in in ("loss", "reward"), "algorithm.kl_in must be loss | reward"),
        (cfg.algorithm.max_sampling_tries >= 0, "algorithm.max_sampling_tries must be >= 0"),
        (cfg.algorithm.gfpo_filter.params.sample_size not in range(1, cfg.rollout.num_generations + 1),
         "algorithm.gfpo_filter.sample_size must be 0 (off) or > rollout.num_generations"),
        (0 <= cfg.algorithm.overlong_cache_fraction < 1, "algorithm.overlong_cache_fraction must be in [0, 1)"),
        (cfg.algorithm.overlong_penalty_factor >= 0, "algorithm.overlong_penalty_factor must be >= 0"),
        (cfg.algorithm.ref_update_steps >= 0, "algorithm.ref_update_steps must be >= 0"),
        (0 < cfg.algorithm.ref_mix_alpha <= 1, "algorithm.ref_mix_alpha must be in (0, 1]"),
        (not cfg.algorithm.kl_ratio_correction or cfg.algorithm.importance_sampling_level in KL_CORRECTION_LOG_RATIOS,
         f"algorithm.kl_ratio_correction supports importance_sampling_level {sorted(KL_CORRECTION_LOG_RATIOS)}"),
        (all(b >= 0 for b in cfg.algorithm.beta_by_domain.values()), "algorithm.beta_by_domain values must be >= 0"),
        (not cfg.algorithm.beta_by_domain or cfg.algorithm.beta > 0,
         "algorithm.beta_by_domain needs algorithm.beta > 0 (the reference model exists only then; beta is the "
         "coefficient of rows whose domain is not listed): set algorithm.beta"),
        (cfg.algorithm.length_reward_alpha >= 0, "algorithm.length_reward_alpha must be >= 0"),
        (cfg.algorithm.wrong_answer_penalty >= 0, "algorithm.wrong_answer_penalty must be >= 0 (the reward is -this)"),
        (not cfg.algorithm.guided_error_correction or getattr(cfg.rollout, "env", None) is None,
         "algorithm.guided_error_correction replaces single-turn completions; it does not work with rollout.env"),
        (not cfg.algorithm.guided_error_correction or not cfg.algorithm.gfpo_filter.params.sample_size,
         "algorithm.guided_error_correction cannot be combined with algorithm.gfpo_filter.sample_size"),
        (cfg.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype must be float32 | bfloat16 | float16"),
        (cfg.lora.r >= 1, "lora.r must be >= 1"),
        (cfg.lora.alpha > 0, "lora.alpha must be > 0"),
        (0 <= cfg.lora.dropout < 1, "lora.dropout must be in [0, 1)"),
        (len(cfg.lora.target_modules) >= 1 and all(cfg.lora.target_modules), "lora.target_modules may not be empty"),
        ("all-linear" not in cfg.lora.target_modules or len(cfg.lora.target_modules) == 1,
         "lora.target_modules: all-linear cannot be combined with module names"),
        ("peft-default" not in cfg.lora.target_modules or len(cfg.lora.target_modules) == 1,
         "lora.target_modules: peft-default cannot be combined with module names"),
        (math.isfinite(cfg.optim.lr) and cfg.optim.lr > 0, f"optim.lr must be a finite number > 0, got {cfg.optim.lr}"),
        (cfg.optim.max_grad_norm >= 0, "optim.max_grad_norm must be >= 0"),
        (cfg.optim.weight_decay >= 0, "optim.weight_decay must be >= 0"),
        (0 <= cfg.optim.adam_beta1 < 1 and 0 <= cfg.optim.adam_beta2 < 1, "optim.adam_beta1 and optim.adam_beta2 must be in [0, 1)"),
        (cfg.optim.warmup_steps >= 0, "optim.warmup_steps must be >= 0"),
        (cfg.optim.lr_scheduler in ("constant", "linear", "cosine"), "optim.lr_scheduler must be constant | linear | cosine"),
        (cfg.train.prompts_per_step >= 1, "train.prompts_per_step must be >= 1"),
        (cfg.train.micro_batch_size >= 0, "train.micro_batch_size must be >= 0"),
        (cfg.cpu.mmap_threshold_mb >= 0, "cpu.mmap_threshold_mb must be >= 0"),
        (cfg.train.micro_batch_tokens >= -1, "train.micro_batch_tokens must be -1 (no limit), 0 (auto) or > 0"),
        (cfg.train.max_steps >= 0, "train.max_steps must be >= 0"),
        (math.isfinite(cfg.train.num_train_epochs) and cfg.train.num_train_epochs >= 0,
         f"train.num_train_epochs must be >= 0 (0 = train.max_steps), got {cfg.train.num_train_epochs}"),
        (cfg.cpu.num_threads >= 0, "cpu.num_threads must be >= 0"),
        (cfg.train.save_steps >= 0, "train.save_steps must be >= 0"),
        (cfg.train.logprob_chunk_size >= 0, "train.logprob_chunk_size must be >= 0 (0 = auto)"),
        (math.isfinite(cfg.train.memory_budget_gib) and cfg.train.memory_budget_gib >= 0,
         f"train.memory_budget_gib must be a finite number >= 0 (0 = auto), got {cfg.train.memory_budget_gib}"),
        (not (cfg.lora.enabled and cfg.algorithm.ref_update_steps),
         "algorithm.ref_update_steps needs full fine-tuning: with lora.enabled the reference is the base model"),
        (cfg.train.logprob_micro_batch_tokens >= -1,
         "train.logprob_micro_batch_tokens must be >= -1 (0 = the update's budget, -1 = no limit)"),
        (cfg.train.ref_offload in ("auto", "none", "disk", "cpu"),
         f"train.ref_offload must be auto | none | disk | cpu, got '{cfg.train.ref_offload}'"),
        (cfg.train.ref_offload in ("auto", "none") or not cfg.algorithm.ref_update_steps,
         f"train.ref_offload={cfg.train.ref_offload} needs algorithm.ref_update_steps = 0 (a refreshed reference "
         "stays in memory): set train.ref_offload none or auto"),
        (cfg.train.save_total_limit >= 0, "train.save_total_limit must be >= 0"),
        (cfg.train.max_bad_steps >= 0, "train.max_bad_steps must be >= 0 (0 = never stop)"),
        (cfg.train.parallel in ("ddp", "fsdp2"), "train.parallel must be ddp | fsdp2"),
        (cfg.train.precision in ("fp32", "bf16", "fp16"),
         f"train.precision must be fp32 | bf16 | fp16, got '{cfg.train.precision}'"),
        (cfg.rollout.precision in ROLLOUT_PRECISIONS,
         f"rollout.precision must be one of {' | '.join(ROLLOUT_PRECISIONS)}, got '{cfg.rollout.precision}'"),
        (cfg.train.precision != "fp16" or cfg.model.dtype == "float32",
         "train.precision=fp16 needs model.dtype=float32 (the loss scaler keeps float32 master weights)"),
        (cfg.cpu.cpu_matmul in ("auto", "onednn", "aten"), "cpu.cpu_matmul must be auto | onednn | aten"),
        (cfg.cpu.decode_kernel in ("auto", "native", "onednn"), "cpu.decode_kernel must be auto | native | onednn"),
        (cfg.rollout.engine in ENGINE_NAMES, f"rollout.engine must be {' | '.join(ENGINE_NAMES)}, got '{cfg.rollout.engine}'"),
        (cfg.rollout.vllm.mode in ("colocate", "server"), "rollout.vllm.mode must be colocate | server"),
        (0 < cfg.rollout.vllm.gpu_memory_utilization <= 1, "rollout.vllm.gpu_memory_utilization must be in (0, 1]"),
        (cfg.rollout.vllm.kv_cache_gb > 0 and cfg.rollout.vllm.tensor_parallel_size >= 1
         and cfg.rollout.vllm.max_model_length >= 0 and cfg.rollout.vllm.server_timeout > 0,
         "rollout.vllm.kv_cache_gb and server_timeout must be > 0, tensor_parallel_size >= 1, max_model_length >= 0"),
        (cfg.rollout.vllm.model_impl in ("auto", "vllm", "transformers"),
         "rollout.vllm.model_impl must be auto | vllm | transformers"),
        (cfg.rollout.vllm.enforce_eager in ("auto", "true", "false"), "rollout.vllm.enforce_eager must be auto | true | false"),
        (cfg.rollout.vllm.dtype in ("auto", "float32", "bfloat16", "float16"),
         "rollout.vllm.dtype must be auto | float32 | bfloat16 | float16"),
        (cfg.cpu.grad_kernel in ("auto", "native", "onednn"), "cpu.grad_kernel must be auto | native | onednn"),
        (cfg.cpu.elementwise_kernel in ("auto", "native", "torch"),
         "cpu.elementwise_kernel must be auto | native | torch"),
        (cfg.cpu.attention_kernel in ("auto", "native", "torch"), "cpu.attention_kernel must be auto | native | torch"),
        (cfg.model.attn_implementation in ("auto", "eager", "sdpa", "flash_attention_2"),
         "model.attn_implementation must be auto | eager | sdpa | flash_attention_2"),
        (cfg.model.attn_implementation != "flash_attention_2" or cfg.model.dtype in ("bfloat16", "float16"),
         f"model.attn_implementation=flash_attention_2 needs model.dtype bfloat16 | float16 (flash-attention has "
         f"no float32 kernel), got '{cfg.model.dtype}'"),
        (cfg.model.device.strip().lower() in ("auto", "cpu", "cuda") or cfg.model.device.strip().lower().startswith("cuda:"),
         "model.device must be auto | cpu | cuda | cuda:N"),
        (cfg.train.resume.strip() != "", "train.resume must be never | auto | a checkpoint directory"),
        (not cfg.reward.process_functions or cfg.reward.step_delimiter != "",
         "reward.step_delimiter may not be empty when reward.process_functions is set"),
        (cfg.algorithm.critic == "none" or cfg.algorithm.advantage == "grpo",
         f"algorithm.critic {cfg.algorithm.critic} replaces the advantage estimator, with grpo's eps and "
         f"scale_rewards: use algorithm.advantage grpo (dr_grpo = {{name: grpo, scale_rewards: none}}), got "
         f"{cfg.algorithm.advantage}"),
        (not (cfg.algorithm.overlong_cache_fraction > 0
              and any(spec.split(":")[0] == "soft_overlong" for spec in cfg.reward.functions)),
         "soft overlong punishment given twice: reward.functions has soft_overlong and "
         "algorithm.overlong_cache_fraction > 0; keep one (algorithm.overlong_cache_fraction is the trainer's way)"),
        (cfg.reward.weights is None or len(cfg.reward.weights) == len(cfg.reward.functions),
         "reward.weights must have one weight per entry of reward.functions"),
        (cfg.reward.weights is None or all(math.isfinite(w) for w in cfg.reward.weights),
         f"reward.weights must be finite numbers, got {cfg.reward.weights}"),
        (cfg.reward.reward_errors in ("raise", "zero"), "reward.reward_errors must be raise | zero"),
        (cfg.reward.timeout_s >= 0, "reward.timeout_s must be >= 0 (0 = no limit)"),
        (rmu.every >= 0, "reward.reward_model_update.every must be >= 0 (0 = off)"),
        (0.0 <= rmu.replay < 1.0, f"reward.reward_model_update.replay must be in [0, 1), got {rmu.replay}"),
        (rmu.steps >= 1 and rmu.batch_size >= 1 and rmu.lr > 0,
         "reward.reward_model_update.steps, batch_size and lr must be positive"),
        (rmu.loss in ("pointwise", "pairwise"),
         f"reward.reward_model_update.loss must be pointwise | pairwise, got {rmu.loss!r}"),
        (not rmu.every or bool(rmu.label),
         "reward.reward_model_update.label: name the reward function that labels samples (e.g. accuracy)"),
        (cfg.data.num_train_prompts >= 1, "data.num_train_prompts must be >= 1"),
        (cfg.data.max_prompt_length >= 0, "data.max_prompt_length must be >= 0 (0 = no limit)"),
        (cfg.data.long_prompts in ("drop", "truncate", "error"), "data.long_prompts must be drop | truncate | error"),
        (cfg.data.split != "", "data.split may not be empty"),
        (cfg.data.prompt_column != "", "data.prompt_column may not be empty"),
        (len(set(cfg.data.column_map.values())) == len(cfg.data.column_map),
         "data.column_map may not map two columns onto the same name"),
        (cfg.data.prompt_column == "prompt" or "prompt" not in cfg.data.column_map.values(),
         "data.prompt_column and data.column_map both choose the prompt column: use one of them"),
        (tracking is None, tracking),
        (metrics_file is None, metrics_file),
        (cfg.train.output_dir.strip() != "", "train.output_dir may not be empty (give a directory; '.' for this one)"),
        (0 <= cfg.train.seed < 2 ** 32, f"train.seed must be in [0, 2**32 - 1], got {cfg.train.seed}"),
        (cfg.log.project.strip() != "", "log.project may not be empty"),
        (cfg.log.samples_per_step >= 0, "log.samples_per_step must be >= 0"),
        (cfg.rollout.max_turns >= 0 and cfg.rollout.tool_timeout_s >= 0 and cfg.rollout.max_observation_chars >= 1,
         "rollout.max_turns and rollout.tool_timeout_s must be >= 0, rollout.max_observation_chars >= 1"),
        ("{}" in cfg.rollout.observation_format, "rollout.observation_format must contain {} (the tool's text)"),
        (0 <= cfg.health.baseline_from < cfg.health.baseline_to,
         "health.baseline_from must be >= 0 and below health.baseline_to"),
        (all(isinstance(v, bool) or not isinstance(v, (int, float)) or v >= 0 for v in vars(cfg.health).values()),
         "health thresholds must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def metrics_file_problem(name: str) -> str | None:
    """Why `log.metrics_file` is not a plain file name inside train.output_dir (None when it is one): no
    directory part, no '..', and none of the names the run writes itself (checkpoints, config.yaml, the lock)."""

    plain = f"log.metrics_file must be a plain file name inside train.output_dir, got '{name}'"
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        return f"{plain} (no directories, no '..')"
    own = ("config.yaml", LOCK_FILE, *RUN_FILES)
    if name.lstrip(".").startswith("checkpoint-") or name in own:
        return f"{plain}: the run writes that name itself (checkpoint-*, {', '.join(own)})"
    return None
