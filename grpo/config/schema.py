"""The configuration tree: the single source of truth for a run.

Every field carries its help text (``metadata["help"]``), which `grpo train --help-config` prints.
Values come from defaults, then a YAML file, then command-line overrides (``--section.key value``);
the tree is validated once and never mutated afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo.config.algorithm import AlgorithmConfig
from grpo.config.cpu import CpuConfig
from grpo.config.engine import VllmConfig
from grpo.config.errors import ConfigError  # noqa: F401  (the config's error, importable from here as before)
from grpo.config.fields import _f
from grpo.config.flow import FlowConfig
from grpo.config.health import HealthConfig


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = _f(None, "Local Hugging Face model directory; empty = the embedded arithmetic base policy.")
    dtype: str = _f("float32", "Parameter dtype: float32 | bfloat16 | float16.")
    trust_remote_code: bool = _f(False, "Allow custom modelling code shipped with the model directory.")
    device: str = _f("auto", "Where the policy, the reference and every tensor of a step live: auto (CUDA when "
                     "available, under torchrun cuda:LOCAL_RANK; else cpu) | cpu | cuda | cuda:N. CPU-only tuning "
                     "(oneDNN linears, allocator threshold, thread count, micro-batch heuristics) applies only on cpu.")
    attn_implementation: str = _f("auto", "Attention kernel: auto (the library's default, sdpa; flash_attention_2 on "
                                  "CUDA when installed and model.dtype is bfloat16 / float16) | eager | sdpa | "
                                  "flash_attention_2 (needs bfloat16 / float16 weights).")


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = _f(False, "Train LoRA adapters (peft) instead of all weights; the KL reference is then the "
                       "base model with adapters disabled (no second copy in memory).")
    r: int = _f(16, "LoRA rank r of the update B A.")
    alpha: int = _f(32, "LoRA alpha: the update is scaled by alpha / r.")
    dropout: float = _f(0.0, "Dropout on the LoRA branch input (training forward passes only; > 0 makes the "
                        "first-iteration ratio differ from 1 because old/ref log-probs run without dropout).")
    target_modules: list[str] = _f(["all-linear"], "Module names that get adapters (q_proj matches every "
                                   "...q_proj); `all-linear` = every linear layer except the output head; `peft-default` = "
                                   "peft's default modules for the model type (TRL's use_peft); one entry "
                                   "with regex characters (*+?[]()|^$\\) is a regular expression on the full module name, "
                                   "as peft's string form (e.g. '.*layers\\.[0-3]\\..*proj').")


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = _f(None, "Prompt dataset: a .jsonl/.json/.csv/.parquet file or a save_to_disk directory; "
                             "a `prompt` column (a string, or a list of {role, content} chat messages), other "
                             "columns go to rewards by name; empty = embedded task.")
    split: str = _f("train", "Split to use when data.dataset is a DatasetDict written by save_to_disk.")
    eval_dataset: str | None = _f(None, "Held-out prompts evaluated every train.eval_steps (same formats and column "
                                  "rules as data.dataset). Default: the Python API's eval_dataset, else, on the "
                                  "embedded task, 256 problems of its held-out split.")
    column_map: dict[str, str] = _f({}, "Rename dataset columns before anything else, "
                                    "e.g. {question: prompt, solution: answer}.")
    task: str = _f("arithmetic", "Embedded task used when no dataset is given: arithmetic | strings (reverse or sort a "
                   "string of 3-6 digits, e.g. reverse:4719; its rewards: exact_match, format).")
    num_train_prompts: int = _f(20000, "Number of prompts generated from the embedded task's train split.")
    prompt_column: str = _f("prompt", "Name of the prompt column in the dataset (copied to `prompt`).")
    system_prompt: str | None = _f(None, "System message prepended to chat prompts; a string prompt becomes a user message "
                                   "after it if the tokenizer has a chat template, else is prefixed by it and a newline.")
    chat_template_kwargs: dict[str, Any] = _f({}, "Extra arguments of the chat template for every prompt, e.g. "
                                              "{enable_thinking: false} for Qwen3 (TRL's chat_template_kwargs).")
    max_prompt_length: int = _f(0, "Longest prompt in tokens, after chat templating (0 = no limit); see data.long_prompts.")
    long_prompts: str = _f("drop", "Prompts longer than data.max_prompt_length: drop | truncate (keep the last tokens) "
                           "| error; the count is logged.")
    shuffle: bool = _f(True, "Shuffle the prompts every epoch (seeded).")
    skip_bad_rows: bool = _f(False, "Skip malformed dataset rows (invalid JSON, missing or empty prompt, wrong type) "
                             "and log how many, instead of stopping at the first one.")


#: `rollout.precision` spellings -> `train.precision` names (verl's rollout.dtype writes bfloat16).
ROLLOUT_PRECISIONS: dict[str, str] = {"auto": "auto", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16",
                                      "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = _f("auto", "What generates the rollouts (docs/engines.md): auto (the fastest measured for the device "
                     "and model size: on CPU native under 50M parameters, vllm from there; vllm on CUDA; native where "
                     "vLLM is not installed) | native (grpo's keyed sampler) | transformers (model.generate) | vllm "
                     "(rollout.vllm: colocated or a `grpo vllm-serve` server; TRL's use_vllm). An explicit vllm turns "
                     "algorithm.rollout_correction on (sequence_mask, TRL's default) unless it is set; auto leaves it.")
    num_generations: int = _f(8, "G: completions sampled per prompt (TRL: num_generations; verl: rollout.n).")
    max_new_tokens: int = _f(48, "Maximum completion length in tokens (TRL: max_completion_length); a completion "
                             "ends earlier at any EOS id: the tokenizer's and every id of the model's "
                             "generation_config.eos_token_id.")
    temperature: float = _f(1.0, "Sampling temperature; also applied to the logits of the training forward pass.")
    top_p: float = _f(1.0, "Nucleus sampling threshold (1.0 = off).")
    min_p: float = _f(0.0, "Min-p sampling: keep tokens with probability >= min_p x the most likely one's, after "
                      "temperature, top-k and top-p (0 = off).")
    repetition_penalty: float = _f(1.0, "Repetition penalty over each completion's prompt and tokens so far, as "
                                   "Hugging Face's generate: a seen token's logit / penalty (if > 0) or x penalty "
                                   "(1.0 = off; > 1 discourages repeats). Not with rollout.env.")
    top_k: int = _f(0, "Top-k sampling (0 = off).")
    precision: str = _f("auto", "Precision of the rollout's forward passes: auto (train.precision's) | fp32 | bf16 | "
                        "fp16 (also verl's rollout.dtype spellings float32 | bfloat16 | float16). bf16 beside an fp32 "
                        "update is verl's / vLLM's bf16 sampler: on a CPU with AVX-512 BF16 / AMX the decode reads "
                        "half the weight bytes (1.5-1.6x faster rollouts of a 100M model on a 2-core AMX Xeon); the "
                        "sampler's log-probs then differ from the update's (metric rollout/logprob_diff; "
                        "algorithm.rollout_correction corrects). "
                        "Emulated (~14x slower) on an AVX2-only CPU. Evaluation keeps train.precision.")
    env: str | None = _f(None, "Multi-turn episodes with tools (docs/agents.md): a built-in environment (calculator | "
                         "python) or file.py:Class; the Python API also takes an object. Empty = single-turn.")
    tool_parser: str = _f("qwen", "How tool calls are read from <tool_call>...</tool_call>: qwen (a JSON "
                          "{name, arguments}) | call (name(argument)) | file.py:function.")
    max_turns: int = _f(4, "Tool calls answered per episode; the next call ends the episode (rollout.max_new_tokens "
                        "caps all tokens of an episode, observations included).")
    tool_timeout_s: float = _f(5.0, "Seconds a tool or env.step may take; past it the model reads an error "
                               "observation and the run goes on (tools/timeouts).")
    max_observation_chars: int = _f(512, "Longer tool outputs are cut to this many characters.")
    observation_format: str = _f("<tool_response>{}</tool_response>", "How an observation is written into the "
                                 "episode ({} = the tool's text); its tokens are context, never trained on.")
    vllm: VllmConfig = field(default_factory=VllmConfig,
                             metadata={"help": "The vLLM engine (rollout.engine vllm): {mode, gpu_memory_utilization, "
                                               "server_base_url, ...} (keys below)."})


@dataclass(frozen=True)
class RewardModelUpdateConfig:
    """`reward.reward_model_update`: keep training a reward model of `reward.functions` on the policy's own
    samples during GRPO (DeepSeekMath's iterative RL; grpo/training/reward_model_updates.py)."""

    every: int = _f(0, "Train the reward model every N steps on the samples of the last N steps (0 = off).")
    replay: float = _f(0.1, "Share of every reward-model batch drawn from the history of earlier samples "
                       "(DeepSeekMath: 10%).")
    label: str = _f("", "Reward function whose value >= threshold labels a sample good (a built-in name or "
                    "file.py:function, called by keyword like every reward); required when every > 0.")
    threshold: float = _f(0.5, "A sample is good (label 1) when the label function gives it >= this.")
    model: str = _f("", "The reward-model directory of reward.functions to train (default: the only one).")
    steps: int = _f(20, "Optimizer steps per update.")
    batch_size: int = _f(16, "Samples per reward-model batch (replay included).")
    lr: float = _f(1e-4, "AdamW learning rate of the reward model.")
    loss: str = _f("pointwise", "pointwise (BCE on the label) | pairwise (Bradley-Terry, good vs bad of a batch).")


@dataclass(frozen=True)
class RewardConfig:
    functions: list[str] = _f([], "Reward functions (empty: the embedded task's own, accuracy and format, when no "
                              "dataset is given; with a dataset, name at least one): built-in names (accuracy, format, math_accuracy, "
                              "think_format, tag_count, cosine_length, repetition_penalty, soft_overlong, "
                              "language_consistency, code_execution; parameters as name:key=value,...), "
                              "`path/to/file.py:function` (sync or async), an import path package.module.function "
                              "(TRL's reward_funcs form) or a reward-model directory.")
    weights: list[float] | None = _f(None, "One weight per reward function (default: all 1.0).")
    process_functions: list[str] = _f([], "Step-reward functions (process supervision, DeepSeekMath 4.1.3): "
                                      "`file.py:function` returning one reward per reasoning step.")
    step_delimiter: str = _f("\n", "Text that ends a reasoning step, for process_functions.")
    reward_errors: str = _f("raise", "A reward function that raises, times out or returns inf or a non-number (NaN "
                            "counts as None, as in TRL): raise (stop with an "
                            "error naming the function and completion) | zero (count it as 0.0; logged as "
                            "reward/<name>/errors).")
    timeout_s: float = _f(0.0, "Seconds one reward call may take (0 = no limit). > 0: a call that does not return in "
                          "time is an error naming the function (reward_errors: zero scores the batch 0.0); sync "
                          "functions then run in a worker thread, abandoned on timeout (Python cannot stop it), "
                          "async ones are cancelled. 0 keeps sync calls in the main thread (signal.alarm works).")
    reward_model_update: RewardModelUpdateConfig = field(
        default_factory=RewardModelUpdateConfig,
        metadata={"help": "Reward-model retraining inside the run: {every, replay, label, ...} (keys below)."})


@dataclass(frozen=True)
class OptimConfig:
    lr: float = _f(1e-6, "AdamW learning rate (peak).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.99, "AdamW beta2.")
    max_grad_norm: float = _f(1.0, "Clip the global gradient norm to this value (0 = no clipping).")
    warmup_steps: int = _f(0, "Linear warm-up steps.")
    lr_scheduler: str = _f("constant", "Schedule after warm-up: constant | linear | cosine.")


@dataclass(frozen=True)
class TrainConfig:
    prompts_per_step: int = _f(8, "B: prompts per step; a step trains on B * G completions.")
    micro_batch_size: int = _f(0, "Completions per forward/backward pass (gradient accumulation, exact); 0 = no "
                               "row limit (train.micro_batch_tokens still applies).")
    micro_batch_tokens: int = _f(0, "Token budget of one forward/backward pass (like verl's ppo_max_token_len_per_gpu): "
                                 "rows bucketed by length, rows x longest row <= this. 0 = auto: "
                                 "2**20 / (hidden_size x num_layers), at least 256 (~150 MiB of activations); "
                                 "-1 = no limit. The update is the same for any value (exact accumulation).")
    logprob_micro_batch_tokens: int = _f(0, "Token budget of one no-grad forward pass (the reference's, the old "
                                         "policy's, entropy; like verl's log_prob_max_token_len_per_gpu): 0 = auto, "
                                         "the update's (train.micro_batch_tokens as planned) or 704, whichever is "
                                         "larger (the update's when 704 does not fit train.memory_budget_gib); -1 = "
                                         "no limit. Same values for any setting; 704 against 256 ran the reference "
                                         "pass ~20 % faster on 100M and 300M models for <= 17 MiB more peak RSS.")
    max_steps: int = _f(100, "Number of GRPO steps.")
    num_train_epochs: float = _f(0.0, "Passes over the training prompts instead of a step count (TRL / transformers: "
                                 "num_train_epochs with max_steps -1): > 0 sets train.max_steps = ceil(num_train_epochs "
                                 "x ceil(prompts / train.prompts_per_step)) once the dataset is loaded (config.yaml "
                                 "records the result); 0 = train.max_steps as given.")
    seed: int = _f(0, "Seed for data order, sampling and initialisation.")
    output_dir: str = _f("runs/train", "Where metrics.jsonl and the final checkpoint are written.")
    save_final: bool = _f(True, "Save the trained policy to output_dir/checkpoint-<step> at the end.")
    gradient_checkpointing: bool | None = _f(None, "Recompute transformer layer activations in the backward pass "
                                             "(less memory, about 30% more update compute): true | false | empty = "
                                             "auto (on only when the update would not fit train.memory_budget_gib).")
    disable_dropout: bool = _f(True, "Set the policy's dropout to 0 (nn.Dropout modules and attention_dropout; TRL's "
                               "disable_dropout, off by default there): the update's log-probs then match the "
                               "rollout's, the reference's and the old policy's. lora.dropout is kept.")
    lean_layers: bool | None = _f(None, "RMSNorm and SwiGLU MLP layers that keep 38% fewer activations for the "
                                  "backward pass and recompute the rest (grpo/modeling/lean_layers.py); same values: "
                                  "true | false | empty = auto (on in one process when the MLPs' products run through "
                                  "oneDNN, cpu.cpu_matmul: there the update measured 5-7% faster on 100M-300M "
                                  "models; off elsewhere: speed-neutral with MKL's products, 2-4% slower on models "
                                  "under 512 wide, 22% slower updates on the 0.8M demo model). Worth turning on for "
                                  "long completions or a tight memory budget.")
    ref_offload: str = _f("auto", "Where the frozen reference policy's weights (beta > 0, full fine-tuning) stay "
                          "between reference passes: none (in memory with the policy) | disk (an unnamed temporary "
                          "file in train.output_dir, read back for each reference pass, bit-identical; "
                          "the OS page cache serves the reads while memory is free) | cpu (host memory, copied to the "
                          "GPU for each pass; saves nothing on a CPU run) | auto (CPU: disk when the reference's weights are >= 64 MiB, else none; "
                          "CUDA: none). Off the step's peak: the update holds the gradients, the reference pass "
                          "does not. Needs algorithm.ref_update_steps = 0 (auto keeps a refreshed reference in "
                          "memory).")
    logprob_chunk_size: int = _f(0, "Tokens per LM-head chunk when computing log-probs (0 = auto: about 32 MiB "
                                 "of float32 logits per chunk, less when train.memory_budget_gib needs it); the full "
                                 "[N, T, vocab] logits never exist.")
    memory_budget_gib: float = _f(0.0, "Memory one step may use (GiB; host RSS on CPU, allocated memory on CUDA). "
                                  "The planner (grpo/training/memory_plan.py) picks train.micro_batch_tokens, "
                                  "train.gradient_checkpointing and train.logprob_chunk_size, those left on auto, so "
                                  "the estimated peak fits, logs the plan at start, and stops before the first step "
                                  "when even the leanest plan does not fit. 0 = auto: what the process holds plus 80% "
                                  "of the memory still available (MemAvailable and the cgroup limit; CUDA: "
                                  "mem_get_info's free memory).")
    save_steps: int = _f(0, "Also save output_dir/checkpoint-<step> every N steps (0 = only the final one).")
    eval_steps: int = _f(0, "Evaluate the policy every N steps on data.eval_dataset, greedy, with the run's reward "
                         "functions: eval/reward/<fn>, eval/pass@1 (first reward >= 0.5), eval/completion_length "
                         "in metrics.jsonl (0 = off).")
    save_total_limit: int = _f(0, "Keep only the newest K checkpoints (0 = keep all).")
    resume: str = _f("never", "Continue an interrupted run: never (start at step 0) | auto (from the newest valid "
                     "checkpoint in output_dir; none yet = start at step 0) | PATH (that checkpoint directory). "
                     "`grpo train --resume` = auto. See docs/reliability.md.")
    overwrite_output_dir: bool = _f(False, "Start over in an output_dir that already holds a run (checkpoints or "
                                    "metrics) with train.resume=never: its checkpoints are deleted and its metrics, "
                                    "samples and alerts emptied, once the first step has succeeded. Off: such a "
                                    "directory is refused (TRL / Trainer's overwrite_output_dir).")
    deterministic: bool = _f(False, "Deterministic kernels (torch.use_deterministic_algorithms) and cuDNN/cuBLAS "
                             "settings: same seed, config and thread count -> identical results.")
    max_bad_steps: int = _f(5, "Stop with an error after this many consecutive steps with a non-finite loss or "
                            "gradient norm (each is skipped); 0 = never stop.")
    parallel: str = _f("ddp", "Data-parallel wrapper under torchrun (docs/distributed.md): ddp (every rank holds "
                       "the model, gradients are all-reduced) | fsdp2 (torch fully_shard: parameters, gradients "
                       "and optimizer state sharded during the update). Ignored in a single process.")
    precision: str = _f("fp32", "Mixed precision of the forward passes (rollout, reference/old log-probs, the update's "
                        "forward and loss): fp32 (none) | bf16 (autocast to bfloat16) | fp16 (autocast to float16 with a "
                        "dynamic loss scaler). Weights, gradients and optimizer state keep model.dtype; log-probs, KL "
                        "and loss are float32 (grpo/modeling/precision.py, docs/performance.md). bf16 is fast only "
                        "where the GEMMs are native (GPU; CPU with AVX-512 BF16 / AMX: 1.42x per step on a 100M "
                        "model at the same peak memory); on an AVX2-only CPU it is emulated, ~14x slower.")


@dataclass(frozen=True)
class LogConfig:
    progress_bar: bool = _f(True, "Show a console progress bar with the headline metrics.")
    metrics_file: str = _f("metrics.jsonl", "Metrics file name inside output_dir (one JSON object per step).")
    report_to: list[str] = _f([], "Trackers that also receive every step's scalars (metrics.jsonl is always written): "
                              "tensorboard (output_dir/tensorboard) | wandb (output_dir/wandb; WANDB_MODE=offline "
                              "works without a network) | trackio (trackio's own directory); none = no tracker. Each "
                              "needs its extra, e.g. pip install -e \".[wandb]\" (docs/logging.md).")
    project: str = _f("grpo", "W&B / trackio project the run is logged under.")
    run_name: str = _f("", "Run name shown by W&B / trackio; empty = the name of train.output_dir.")
    samples_per_step: int = _f(2, "Completions saved to output_dir/samples.jsonl each step, for `grpo report`: the best "
                               "and the worst of a group (2 per group, from the first groups); 0 = none.")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)    # Flow-GRPO (grpo/config/flow.py)
    cpu: CpuConfig = field(default_factory=CpuConfig)       # the CPU runtime's settings (grpo/config/cpu.py)


SECTIONS: dict[str, type] = {
    "model": ModelConfig, "lora": LoraConfig, "data": DataConfig, "rollout": RolloutConfig, "reward": RewardConfig,
    "algorithm": AlgorithmConfig, "optim": OptimConfig, "train": TrainConfig, "log": LogConfig,
    "health": HealthConfig, "flow": FlowConfig, "cpu": CpuConfig,
}
