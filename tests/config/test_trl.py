"""TRL GRPOConfig keys resolve to the same config as our own keys (table-driven over every mapped key)."""

import pytest

from grpo.config import ConfigError, build_config
from grpo.api.inputs import resolve_config
from grpo.config.trl import ALL_KEYS, LOSS_TYPES, NO_EFFECT, TRL_KEYS, from_trl

#: (TRL keys, our keys that must give the same Config). Every key of TRL_KEYS appears at least once.
CASES = [
    ({"learning_rate": 3e-6}, {"optim.lr": 3e-6}),
    ({"weight_decay": 0.1}, {"optim.weight_decay": 0.1}),
    ({"adam_beta1": 0.8}, {"optim.adam_beta1": 0.8}),
    ({"adam_beta2": 0.95}, {"optim.adam_beta2": 0.95}),
    ({"max_grad_norm": 0.5}, {"optim.max_grad_norm": 0.5}),
    ({"warmup_steps": 7}, {"optim.warmup_steps": 7}),
    ({"lr_scheduler_type": "cosine"}, {"optim.lr_scheduler": "cosine"}),
    ({"lr_scheduler_type": "constant_with_warmup"}, {"optim.lr_scheduler": "constant"}),
    ({"num_generations": 16}, {"rollout.num_generations": 16}),
    ({"max_completion_length": 256}, {"rollout.max_new_tokens": 256}),
    ({"temperature": 0.7}, {"rollout.temperature": 0.7}),
    ({"top_p": 0.9}, {"rollout.top_p": 0.9}),
    ({"top_k": 50}, {"rollout.top_k": 50}),
    ({"top_k": None}, {"rollout.top_k": 0}),
    ({"min_p": 0.1, "repetition_penalty": 1.1}, {"rollout.min_p": 0.1, "rollout.repetition_penalty": 1.1}),
    ({"min_p": None}, {"rollout.min_p": 0.0}),
    ({"max_prompt_length": 512}, {"data.max_prompt_length": 512}),
    ({"max_prompt_length": None}, {"data.max_prompt_length": 0}),
    ({"shuffle_dataset": False}, {"data.shuffle": False}),
    ({"beta": 0.0}, {"algorithm.beta": 0.0}),
    ({"epsilon": 0.1}, {"algorithm.epsilon": 0.1}),
    ({"epsilon_high": 0.28}, {"algorithm.epsilon_high": 0.28}),
    ({"loss_type": "grpo"}, {"algorithm.loss_agg_mode": "seq-mean-token-mean"}),
    ({"loss_type": "dapo"}, {"algorithm.loss_agg_mode": "token-mean"}),
    ({"loss_type": "bnpo"}, {"algorithm.loss_agg_mode": "token-mean"}),
    ({"loss_type": "dr_grpo"}, {"algorithm.loss_agg_mode": "seq-mean-token-sum-norm"}),
    ({"loss_type": "cispo", "epsilon_high": 5.0},
     {"algorithm.policy_loss": "cispo", "algorithm.loss_agg_mode": "token-mean", "algorithm.cispo_max": 5.0,
      "algorithm.epsilon_high": 5.0}),
    ({"loss_type": "cispo"}, {"algorithm.policy_loss": "cispo", "algorithm.loss_agg_mode": "token-mean",
                              "algorithm.cispo_max": 0.2}),                     # TRL: epsilon_high = epsilon = 0.2
    ({"loss_type": "sapo", "sapo_temperature_pos": 0.9, "sapo_temperature_neg": 1.2},
     {"algorithm.policy_loss": "sapo", "algorithm.sapo_tau_pos": 0.9, "algorithm.sapo_tau_neg": 1.2}),
    ({"loss_type": "luspo", "importance_sampling_level": "sequence"},
     {"algorithm.loss_agg_mode": "seq-mean-token-sum", "algorithm.importance_sampling_level": "sequence"}),
    ({"loss_type": "vespo", "vespo_k_pos": 1.0, "vespo_lambda_pos": 2.0, "vespo_k_neg": 4.0, "vespo_lambda_neg": 1.0},
     {"algorithm.policy_loss": "vespo", "algorithm.loss_agg_mode": "token-mean", "algorithm.vespo_k_pos": 1.0,
      "algorithm.vespo_lambda_pos": 2.0, "algorithm.vespo_k_neg": 4.0, "algorithm.vespo_lambda_neg": 1.0}),
    ({"delta": 4.0}, {"algorithm.clip_delta": 4.0}),
    ({"disable_dropout": False, "entropy_coef": 0.01}, {"train.disable_dropout": False, "algorithm.entropy_coef": 0.01}),
    ({"use_adaptive_entropy": True, "entropy_target": 1.5, "entropy_coef_delta": 0.001, "entropy_coef_min": 0.001,
      "entropy_coef_max": 0.1},
     {"algorithm.entropy_control": "adaptive", "algorithm.entropy_target": 1.5, "algorithm.entropy_coef_delta": 0.001,
      "algorithm.entropy_coef_min": 0.001, "algorithm.entropy_coef_max": 0.1}),
    ({"use_adaptive_entropy": False}, {"algorithm.entropy_control": "fixed"}),
    ({"multi_objective_aggregation": "normalize_then_sum", "scale_rewards": "group"},   # TRL: batch std regardless
     {"algorithm.reward_combination": "normalize_then_sum", "algorithm.scale_rewards": "batch"}),
    ({"multi_objective_aggregation": "sum_then_normalize"}, {"algorithm.reward_combination": "sum_then_normalize"}),
    ({"scale_rewards": False}, {"algorithm.scale_rewards": "none"}),
    ({"scale_rewards": True}, {"algorithm.scale_rewards": "group"}),
    ({"scale_rewards": "batch"}, {"algorithm.scale_rewards": "batch"}),
    ({"scale_rewards": "False"}, {"algorithm.scale_rewards": "none"}),
    ({"importance_sampling_level": "sequence"}, {"algorithm.importance_sampling_level": "sequence"}),
    ({"num_iterations": 2}, {"algorithm.num_iterations": 2}),
    ({"mask_truncated_completions": True}, {"algorithm.overlong_filter": True}),
    ({"top_entropy_quantile": 0.2}, {"algorithm.top_entropy_rho": 0.2}),
    ({"use_bias_correction_kl": True, "off_policy_mask_threshold": 0.5},
     {"algorithm.kl_ratio_correction": True, "algorithm.off_policy_mask_threshold": 0.5}),
    ({"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_min": 0.5,
      "vllm_importance_sampling_clip_max": 2.0},
     {"algorithm.rollout_correction": "token_truncate", "algorithm.rollout_correction_min": 0.5,
      "algorithm.rollout_correction_max": 2.0}),
    ({"reward_weights": [1.0, 0.5]}, {"reward.weights": [1.0, 0.5]}),
    ({"max_steps": 12}, {"train.max_steps": 12}),
    ({"seed": 42}, {"train.seed": 42}),
    ({"output_dir": "out/x"}, {"train.output_dir": "out/x"}),
    ({"save_steps": 50}, {"train.save_steps": 50}),
    ({"save_total_limit": 3}, {"train.save_total_limit": 3}),
    ({"save_total_limit": None}, {"train.save_total_limit": 0}),
    ({"gradient_checkpointing": True}, {"train.gradient_checkpointing": True}),
    ({"overwrite_output_dir": True}, {"train.overwrite_output_dir": True}),
    # warm-up: whole updates; a fraction (warmup_ratio, or warmup_steps < 1) of TRL's max_steps, rounded up
    ({"warmup_ratio": 0.1, "max_steps": 25}, {"optim.warmup_steps": 3, "train.max_steps": 25}),
    ({"warmup_steps": 0.5, "max_steps": 10}, {"optim.warmup_steps": 5, "train.max_steps": 10}),
    ({"warmup_steps": 4, "warmup_ratio": 0.5, "max_steps": 10}, {"optim.warmup_steps": 4, "train.max_steps": 10}),
    ({"warmup_ratio": 0.0}, {"optim.warmup_steps": 0}),
    # TRL's max_steps -1 (or 0): train num_train_epochs (3 by default); max_steps comes from the dataset's size
    ({"max_steps": -1, "learning_rate": 2e-6}, {"optim.lr": 2e-6, "train.num_train_epochs": 3.0}),
    ({"max_steps": 0, "num_train_epochs": 1.5}, {"train.num_train_epochs": 1.5}),
    ({"num_train_epochs": 2}, {"train.num_train_epochs": 2.0}),
    ({"num_train_epochs": 3.0}, {"train.num_train_epochs": 3.0}),       # without max_steps: epochs
    ({"num_train_epochs": 1, "max_steps": 20}, {"train.max_steps": 20}),  # TRL ignores epochs then
    ({"save_steps": 0.25, "max_steps": 20}, {"train.save_steps": 5, "train.max_steps": 20}),
    # recipe keys at their defaults: a note each
    ({"model_revision": "main", "dataset_config": None, "dataset_test_split": "test", "dataset_streaming": False,
      "lora_task_type": "CAUSAL_LM", "push_to_hub": False, "gradient_checkpointing_use_reentrant": False,
      "gradient_checkpointing_kwargs": {"use_reentrant": False}}, {}),
    # values as TRL's parser reads them: booleans from strings, numbers from strings, JSON objects
    ({"use_peft": "Yes", "bf16": "f", "shuffle_dataset": 0, "lora_target_modules": "all-linear"},
     {"lora.enabled": True, "train.precision": "fp32", "data.shuffle": False, "lora.dropout": 0.05,   # TRL's 0.05
      "lora.target_modules": ["all-linear"]}),
    ({"num_generations": "4", "learning_rate": "1e-5"}, {"rollout.num_generations": 4, "optim.lr": 1e-5}),
    ({"generation_kwargs": '{"top_k": 5}'}, {"rollout.top_k": 5}),
    ({"report_to": ["none"]}, {"log.report_to": []}),
    ({"disable_tqdm": True}, {"log.progress_bar": False}),
    ({"report_to": "tensorboard"}, {"log.report_to": ["tensorboard"]}),
    ({"report_to": "none"}, {"log.report_to": []}),
    ({"run_name": "exp1"}, {"log.run_name": "exp1"}),
    # combined keys: 8 completions per device x 4 accumulation steps / 16 per group = 2 prompts per step
    ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "num_generations": 16},
     {"train.micro_batch_size": 8, "train.prompts_per_step": 2, "rollout.num_generations": 16}),
    ({"per_device_train_batch_size": 16}, {"train.micro_batch_size": 16, "train.prompts_per_step": 2}),
    # a generation batch of 4 x 8 = 32 completions (8 prompts of G = 4), 8 / 2 = 4 optimizer updates on it
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "steps_per_generation": 8,
      "num_generations": 4},
     {"train.micro_batch_size": 4, "train.prompts_per_step": 8, "algorithm.mini_batches": 4,
      "rollout.num_generations": 4}),
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "generation_batch_size": 32,
      "num_generations": 4, "max_steps": 40},
     {"train.micro_batch_size": 4, "train.prompts_per_step": 8, "algorithm.mini_batches": 4,
      "rollout.num_generations": 4, "train.max_steps": 10}),
    # TRL's max_steps / save_steps count optimizer updates: 2 per generation batch with num_iterations 2
    ({"save_strategy": "no", "eval_strategy": "steps", "eval_steps": 10}, {"train.save_steps": 0, "train.eval_steps": 10}),
    ({"save_strategy": "steps", "eval_steps": 10}, {"train.eval_steps": 0}),        # TRL: eval_strategy no by default
    ({"max_steps": 100, "save_steps": 20, "num_iterations": 2},
     {"train.max_steps": 50, "train.save_steps": 10, "algorithm.num_iterations": 2}),
    ({"sync_ref_model": True, "ref_model_sync_steps": 64, "ref_model_mixup_alpha": 0.9},
     {"algorithm.ref_update_steps": 64, "algorithm.ref_mix_alpha": 0.9}),
    ({"sync_ref_model": True}, {"algorithm.ref_update_steps": 512, "algorithm.ref_mix_alpha": 0.6}),
    ({"sync_ref_model": False, "ref_model_sync_steps": 64}, {}),
    # TRL's ModelConfig and `trl grpo` script arguments
    ({"model_name_or_path": "models/qwen"}, {"model.path": "models/qwen"}),
    ({"dtype": "bfloat16"}, {"model.dtype": "bfloat16"}),
    ({"torch_dtype": "float16"}, {"model.dtype": "float16"}),
    ({"trust_remote_code": True}, {"model.trust_remote_code": True}),
    ({"attn_implementation": "eager"}, {"model.attn_implementation": "eager"}),
    ({"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_target_modules": ["q_proj", "v_proj"]},
     {"lora.enabled": True, "lora.r": 8, "lora.alpha": 16, "lora.dropout": 0.05, "lora.target_modules": ["q_proj", "v_proj"]}),
    ({"lora_target_modules": None}, {"lora.target_modules": ["all-linear"]}),        # no LoRA: changes nothing
    ({"use_peft": True, "lora_target_modules": ["q_proj"]},                            # ModelConfig's defaults
     {"lora.enabled": True, "lora.r": 16, "lora.alpha": 32, "lora.dropout": 0.05, "lora.target_modules": ["q_proj"]}),
    ({"use_cpu": True}, {"model.device": "cpu"}),
    ({"use_cpu": False}, {"model.device": "auto"}),
    # transformers' optimizer names grpo honours (its AdamW); `optim` as a mapping stays our section
    ({"optim": "adamw_torch", "learning_rate": 2e-6}, {"optim.lr": 2e-6}),
    ({"optim": "adamw_torch_fused", "optim.lr": 3e-6}, {"optim.lr": 3e-6}),
    # TRL's scale_rewards "none" (written as text in YAML / on the command line)
    ({"scale_rewards": "none"}, {"algorithm.scale_rewards": "none"}),
    # transformers' constant schedule ignores warm-up; constant_with_warmup uses it
    ({"lr_scheduler_type": "constant", "warmup_steps": 4}, {"optim.lr_scheduler": "constant", "optim.warmup_steps": 0}),
    ({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 4},
     {"optim.lr_scheduler": "constant", "optim.warmup_steps": 4}),
    # top_entropy_quantile 0.0: TRL keeps only the highest-entropy token; rho 1e-9 keeps ceil(1e-9 x n) = 1
    ({"top_entropy_quantile": 0.0}, {"algorithm.top_entropy_rho": 1e-9}),
    # keys with no counterpart here, at TRL's defaults: a note each
    ({"use_rslora": False, "use_dora": "false", "lora_modules_to_save": None, "lora_target_parameters": None,
      "load_in_4bit": False, "load_in_8bit": False, "bnb_4bit_quant_type": "nf4", "use_bnb_nested_quant": False,
      "remove_unused_columns": False, "data_seed": None, "dataloader_drop_last": False, "dataloader_pin_memory": True,
      "dataloader_num_workers": 0, "dataloader_persistent_workers": False,
      "dataloader_prefetch_factor": None, "bnb_4bit_quant_storage": None, "num_generations_eval": None, "cast_lm_head_to_fp32": False,
      "router_aux_loss_coef": None, "vllm_structured_outputs_regex": None}, {}),
    ({"chat_template_kwargs": {"enable_thinking": False}}, {"data.chat_template_kwargs": {"enable_thinking": False}}),
    ({"max_tool_calling_iterations": 6}, {"rollout.max_turns": 6}),
    ({"generation_kwargs": {"min_p": 0.05, "repetition_penalty": 1.1, "top_k": None}, "temperature": 0.9},
     {"rollout.min_p": 0.05, "rollout.repetition_penalty": 1.1, "rollout.top_k": 0, "rollout.temperature": 0.9}),
    ({"model_init_kwargs": {"torch_dtype": "bfloat16", "attn_implementation": "eager"}},
     {"model.dtype": "bfloat16", "model.attn_implementation": "eager"}),
    ({"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_correction": False},
     {"algorithm.rollout_correction": "none"}),
    ({"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_correction": True,
      "vllm_importance_sampling_cap": 2.0},
     {"algorithm.rollout_correction": "token_truncate", "algorithm.rollout_correction_max": 2.0}),
    ({"dataset_name": "data/prompts.jsonl", "dataset_train_split": "train"},
     {"data.dataset": "data/prompts.jsonl", "data.split": "train"}),
    ({"reward_funcs": ["accuracy", "my_rewards.reward_len"]}, {"reward.functions": ["accuracy", "my_rewards.reward_len"]}),
    ({"reward_funcs": "format"}, {"reward.functions": ["format"]}),
    ({"reward_model_name_or_path": "rm_dir", "reward_funcs": ["format"]}, {"reward.functions": ["rm_dir", "format"]}),
    # the generation backend: use_vllm -> rollout.engine, vllm_* -> rollout.vllm.*
    ({"use_vllm": True}, {"rollout.engine": "vllm"}),
    ({"use_vllm": False}, {"rollout.engine": "native"}),        # no vLLM, as written
    ({"use_vllm": "true", "vllm_mode": "server", "vllm_server_base_url": "http://10.0.0.2:8001",
      "vllm_server_timeout": 60},
     {"rollout.engine": "vllm", "rollout.vllm.mode": "server", "rollout.vllm.server_base_url": "http://10.0.0.2:8001",
      "rollout.vllm.server_timeout": 60.0}),
    ({"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5, "vllm_tensor_parallel_size": 2,
      "vllm_enable_sleep_mode": True, "vllm_max_model_length": 4096, "vllm_model_impl": "transformers"},
     {"rollout.vllm.mode": "colocate", "rollout.vllm.gpu_memory_utilization": 0.5,
      "rollout.vllm.tensor_parallel_size": 2, "rollout.vllm.enable_sleep_mode": True,
      "rollout.vllm.max_model_length": 4096, "rollout.vllm.model_impl": "transformers"}),
    ({"vllm_max_model_length": None, "vllm_server_host": "10.0.0.3", "vllm_server_port": "8100",
      "vllm_server_base_url": None},
     {"rollout.vllm.max_model_length": 0, "rollout.vllm.server_host": "10.0.0.3", "rollout.vllm.server_port": 8100}),
    ({"generation_kwargs": {"max_tokens": 32, "temperature": "0.7", "top_p": 0.9}, "temperature": 1.2},
     {"rollout.max_new_tokens": 32, "rollout.temperature": 0.7, "rollout.top_p": 0.9}),   # they win, as in TRL
    ({"generation_kwargs": {"max_new_tokens": 24, "min_p": None}}, {"rollout.max_new_tokens": 24, "rollout.min_p": 0.0}),
]


@pytest.mark.parametrize("trl, ours", CASES, ids=[",".join(t) for t, _ in CASES])
def test_trl_keys_resolve_to_our_keys(trl, ours):
    if "reward.weights" in ours:             # weights need as many reward functions
        ours = {**ours, "reward.functions": ["accuracy", "format"]}
        trl = {**trl, "reward.functions": ["accuracy", "format"]}
    assert resolve_config(trl) == build_config(overrides=ours)


def test_every_mapped_key_is_in_the_table():
    covered = {k for trl, _ in CASES for k in trl}
    assert set(TRL_KEYS) <= covered
    assert ALL_KEYS - {"bf16", "fp16", "report_to", "run_name"} - set(NO_EFFECT) <= covered
    assert set(LOSS_TYPES) <= {t["loss_type"] for t, _ in CASES if "loss_type" in t}


@pytest.mark.parametrize("key", sorted(NO_EFFECT))
def test_keys_without_effect_are_accepted_with_a_note(key):
    overrides, lines = from_trl({key: 1, "beta": 0.0})
    assert overrides == {"algorithm.beta": 0.0}
    assert lines == [f"{key} ignored ({NO_EFFECT[key]})", "beta -> algorithm.beta"]


def test_mapping_lines_name_both_keys():
    overrides, lines = from_trl({"learning_rate": 1e-6, "per_device_train_batch_size": 8,
                                 "gradient_accumulation_steps": 2, "num_generations": 8})
    assert overrides == {"optim.lr": 1e-6, "rollout.num_generations": 8, "train.micro_batch_size": 8,
                         "train.prompts_per_step": 2}
    assert "learning_rate -> optim.lr" in lines
    assert "per_device_train_batch_size, gradient_accumulation_steps -> train.micro_batch_size, " \
           "train.prompts_per_step" in lines


def test_world_size_counts_in_the_prompts_per_step():
    overrides, _ = from_trl({"per_device_train_batch_size": 8, "num_generations": 8}, world_size=4)
    assert overrides["train.prompts_per_step"] == 4


def test_our_keys_win_over_trl_keys_in_one_dict():
    cfg = resolve_config({"learning_rate": 1e-6, "optim.lr": 2e-6})
    assert cfg.optim.lr == 2e-6


@pytest.mark.parametrize("trl, message", [
    ({"push_to_hub": True}, "TRL key 'push_to_hub': no hub uploads here: set it false"),
    ({"num_trian_epochs": 3, "learning_rat": 1e-6, "algo": {}},
     "keys 'num_trian_epochs' \\(did you mean 'num_train_epochs'\\?\\), 'learning_rat' \\(did you mean "
     "'learning_rate'\\?\\), 'algo' \\(did you mean 'algorithm'\\?\\): no TRL key grpo maps, nor one of its sections"),
    ({"model_revision": "v1.0"}, "TRL key 'model_revision': grpo loads local model directories: save revision 'v1.0'"),
    ({"dataset_config": "main"}, "TRL key 'dataset_config': grpo reads local files .* save configuration 'main'"),
    ({"dataset_streaming": True}, "TRL key 'dataset_streaming': no streaming here"),
    ({"lora_task_type": "SEQ_CLS"}, "TRL key 'lora_task_type': 'SEQ_CLS': grpo trains causal LMs"),
    ({"warmup_ratio": 0.1}, "TRL key 'warmup_ratio'=0.1 is a fraction of max_steps: give max_steps"),
    ({"warmup_ratio": 2}, "TRL key 'warmup_ratio' must be >= 0 \\(below 1: a fraction of max_steps\\), got 2"),
    ({"save_steps": 0.5}, "TRL key 'save_steps'=0.5 is a fraction of max_steps"),
    ({"max_steps": 5.5}, "TRL key 'max_steps' expects an integer, got 5.5"),
    # values of the wrong type: one line naming the key and the value, never a TypeError
    ({"num_generations": "abc"}, "TRL key 'num_generations' expects an integer, got 'abc'"),
    ({"num_generations": 0}, "TRL key 'num_generations' must be >= 1, got 0"),
    ({"gradient_accumulation_steps": 0}, "TRL key 'gradient_accumulation_steps' must be >= 1, got 0"),
    ({"per_device_train_batch_size": "abc"}, "TRL key 'per_device_train_batch_size' expects an integer, got 'abc'"),
    ({"steps_per_generation": "x"}, "TRL key 'steps_per_generation' expects an integer, got 'x'"),
    ({"num_iterations": "abc"}, "TRL key 'num_iterations' expects an integer, got 'abc'"),
    ({"max_steps": "abc"}, "TRL key 'max_steps' expects an integer, got 'abc'"),
    ({"eval_steps": "abc"}, "TRL key 'eval_steps' expects a number, got 'abc'"),
    ({"generation_batch_size": "abc"}, "TRL key 'generation_batch_size' expects an integer, got 'abc'"),
    ({"learning_rate": [1]}, "TRL key 'learning_rate' expects a number, got \\[1\\]"),
    ({"report_to": 5}, "TRL key 'report_to' expects a name or a list of names, got 5"),
    ({"reward_weights": ["x"]}, "TRL key 'reward_weights' \\(entry 'x'\\) expects a number, got 'x'"),
    ({"generation_kwargs": [1, 2]}, "TRL key 'generation_kwargs' expects a mapping \\(a JSON object"),
    ({"model_init_kwargs": "abc"}, "TRL key 'model_init_kwargs' expects a mapping .*got 'abc'"),
    ({"bf16": "maybe"}, "TRL key 'bf16' expects true or false \\(yes/no, t/f, y/n, 1/0\\), got 'maybe'"),
    ({"disable_tqdm": "abc"}, "TRL key 'disable_tqdm' expects true or false"),
    ({"vllm_importance_sampling_correction": "abc"}, "TRL key 'vllm_importance_sampling_correction' expects true"),
    ({"use_peft": 2}, "TRL key 'use_peft' expects true or false .*got 2"),
    ({"num_generations": None}, "TRL key 'num_generations' needs a value, got None"),
    ({"shuffle_dataset": None}, "TRL key 'shuffle_dataset' needs a value, got None"),
    ({"scale_rewards": "yes"}, "TRL key 'scale_rewards': 'yes' has no equivalent here \\(group, batch, none, true"),
    ({"torch_dtype": "auto"}, "TRL key 'dtype': 'auto' has no equivalent here; set float32, bfloat16 or float16"),
    ({"loss_type": "gpg"}, "TRL key 'loss_type': 'gpg' has no equivalent"),
    ({"lr_scheduler_type": "polynomial"}, "TRL key 'lr_scheduler_type': 'polynomial'"),
    ({"per_device_train_batch_size": 6, "num_generations": 4}, "not divisible by num_generations=4"),
    ({"bf16": True, "fp16": True}, "bf16 and fp16 are both true"),
    ({"max_steps": 5, "num_iterations": 2}, "TRL key max_steps=5 counts optimizer updates, 2 per generation batch"),
    ({"save_strategy": "epoch"}, "TRL key save_strategy: 'epoch' has no equivalent here"),
    ({"model_init_kwargs": {"device_map": "auto"}}, "TRL key model_init_kwargs: device_map has no equivalent here"),
    ({"generation_kwargs": {"num_beams": 4}}, "TRL key generation_kwargs: num_beams has no equivalent here"),
    ({"eval_strategy": "steps"}, "eval_strategy: steps needs eval_steps here"),
    ({"optim": "adafactor"}, "TRL key 'optim': 'adafactor' is transformers' optimizer name \\(TRL's optim key\\): grpo "
                             "trains with AdamW only \\(adamw_torch, adamw_torch_fused\\)"),
    ({"use_rslora": True}, "TRL key 'use_rslora': rank-stabilised LoRA is not implemented here"),
    ({"use_dora": True}, "TRL key 'use_dora': DoRA is not implemented here"),
    ({"lora_modules_to_save": ["lm_head"]}, "TRL key 'lora_modules_to_save': grpo's LoRA trains the adapters only"),
    ({"load_in_4bit": True}, "TRL key 'load_in_4bit': no quantized \\(bitsandbytes\\) loading here"),
    ({"remove_unused_columns": True}, "TRL key 'remove_unused_columns': grpo passes every dataset column"),
    ({"data_seed": 3}, "TRL key 'data_seed': grpo shuffles the prompts with seed"),
    ({"dataloader_drop_last": True}, "TRL key 'dataloader_drop_last': grpo has no DataLoader"),
    ({"num_generations_eval": 4}, "TRL key 'num_generations_eval': 4: grpo's evaluation decodes one greedy"),
    ({"cast_lm_head_to_fp32": True}, "TRL key 'cast_lm_head_to_fp32': no fp32 LM-head cast here"),
    ({"router_aux_loss_coef": 0.001}, "TRL key 'router_aux_loss_coef': 0.001: the MoE router's auxiliary loss"),
    ({"vllm_structured_outputs_regex": "a+"}, "TRL key 'vllm_structured_outputs_regex': 'a\\+': grpo's engines do "
                                              "not constrain generation by a regex"),
    ({"vllm_mode": "remote"}, "^TRL key 'vllm_mode': 'remote' is none of colocate \\| server$"),
    ({"vllm_model_impl": "sglang"}, "^TRL key 'vllm_model_impl': 'sglang' is none of vllm \\| transformers \\| auto$"),
    ({"vllm_gpu_memory_utilization": 1.5}, "^TRL key 'vllm_gpu_memory_utilization' must be in \\(0, 1\\], got 1.5$"),
    ({"vllm_gpu_memory_utilization": "half"}, "^TRL key 'vllm_gpu_memory_utilization' expects a number, got 'half'$"),
    ({"vllm_server_timeout": 0}, "^TRL key 'vllm_server_timeout' must be > 0 seconds, got 0"),
    ({"vllm_server_port": 0}, "^TRL key 'vllm_server_port' must be >= 1, got 0$"),
    ({"vllm_tensor_parallel_size": "two"}, "^TRL key 'vllm_tensor_parallel_size' expects an integer, got 'two'$"),
    ({"vllm_max_model_length": 0}, "^TRL key 'vllm_max_model_length' must be >= 1, got 0$"),
    ({"use_vllm": "sometimes"}, "^TRL key 'use_vllm' expects true or false"),
    ({"generation_kwargs": {"temperature": 0.7, "presence_penalty": 0.5}},
     "^TRL key generation_kwargs: presence_penalty has no equivalent here \\(known: temperature, top_p, top_k, min_p, "
     "repetition_penalty, max_new_tokens, max_tokens\\)$"),
    ({"generation_kwargs": {"temperature": "hot"}}, "^TRL key generation_kwargs\\['temperature'\\] expects a number, "
                                                    "got 'hot'$"),
    ({"generation_kwargs": {"max_tokens": 0}}, "^TRL key generation_kwargs\\['max_tokens'\\] must be >= 1, got 0$"),
    ({"generation_kwargs": {"temperature": None}}, "^TRL key generation_kwargs\\['temperature'\\] needs a value"),
    ({"steps_per_generation": 3, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 8},
     "steps_per_generation=3 is not a multiple of gradient_accumulation_steps=2"),
])
def test_keys_without_an_equivalent_are_errors_naming_them(trl, message):
    with pytest.raises(ConfigError, match=message):
        from_trl(trl)


def test_a_trl_grpo_recipe_file_builds_as_it_is(tmp_path):
    """A `trl grpo --config` YAML (GRPOConfig, ModelConfig and script keys at the top level) through the CLI's
    config path gives the config of the same settings written with our keys."""
    import argparse

    from grpo.cli.main import config_from_args

    model = tmp_path / "qwen"                # use_peft's lora_target_modules None: peft's default for qwen2
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text(f"model_name_or_path: {model}\ndtype: bfloat16\ndataset_name: data/p.jsonl\n"
                      "reward_funcs: [accuracy, format]\nreward_weights: [1.0, 0.5]\nlearning_rate: 1.0e-6\n"
                      "lr_scheduler_type: cosine\nbeta: 0.0\nnum_generations: 4\nper_device_train_batch_size: 4\n"
                      "gradient_accumulation_steps: 4\nmax_completion_length: 64\nmax_steps: 10\nbf16: true\n"
                      "use_peft: true\nlora_r: 8\nlogging_steps: 5\nuse_vllm: false\noutput_dir: out/r\n")
    args = argparse.Namespace(config=str(recipe), reward=None, **{k: None for k in ("model", "dataset", "output_dir",
                              "max_steps", "seed", "algorithm", "resume")})
    cfg = config_from_args(args, ["--learning-rate", "2e-6", "--lora.r", "4"])      # CLI after file; ours win
    assert cfg == build_config(overrides={
        "model.path": str(model), "model.dtype": "bfloat16", "data.dataset": "data/p.jsonl",
        "reward.functions": ["accuracy", "format"], "reward.weights": [1.0, 0.5], "optim.lr": 2e-6,
        "optim.lr_scheduler": "cosine", "algorithm.beta": 0.0, "rollout.num_generations": 4,
        "train.micro_batch_size": 4, "train.prompts_per_step": 4, "rollout.max_new_tokens": 64,
        "train.max_steps": 10, "train.precision": "bf16", "lora.enabled": True, "lora.r": 4,
        "lora.dropout": 0.05, "lora.target_modules": ["q_proj", "v_proj"],
        "train.output_dir": "out/r", "rollout.engine": "native"})


def test_trl_names_are_the_mapped_keys_and_transformers_training_arguments():
    from grpo.config.trl import is_trl_name

    assert [is_trl_name(k) for k in ("learning_rate", "lr_scheduler_kwargs", "fsdp_config", "eval_on_start",
                                     "trainer", "algo")] == [True, True, True, True, False, False]
