"""Checks of what a run means once the model, tokenizer and prompts are known (grpo/training/run_checks.py)."""

import logging

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import grpo
from grpo.config import ConfigError, build_config
from grpo.modeling.models import build_model, build_tokenizer
from grpo.training.run_checks import PositionLimit, check_positions, check_run, check_vocabulary, position_limit
from tests.conftest import tiny_qwen2

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]


def tiny_gpt2(vocab_size: int, n_positions: int = 64) -> GPT2LMHeadModel:
    """A GPT-2 with absolute (learned) position embeddings: wpe has n_positions rows."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=32, n_layer=1,
                                      n_head=2)).eval()


def digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def test_position_limits_of_absolute_and_rotary_models():
    assert position_limit(tiny_gpt2(40)) == PositionLimit(64, True, "transformer.wpe (64 rows)")
    assert position_limit(tiny_qwen2()) == PositionLimit(128, False, "max_position_embeddings=128")
    assert position_limit(torch.nn.Linear(2, 2)) is None


def test_too_many_new_tokens_is_an_error_for_absolute_positions():
    check_positions(tiny_gpt2(40), max_new_tokens=54, prompt_tokens=10)        # 64 positions: exactly fits
    with pytest.raises(ConfigError) as info:
        check_positions(tiny_gpt2(40), max_new_tokens=55, prompt_tokens=10)
    assert str(info.value) == ("rollout.max_new_tokens=55 plus the longest prompt (10 tokens) needs 65 positions, but "
                               "the model has 64 absolute position embeddings (transformer.wpe (64 rows)): lower "
                               "rollout.max_new_tokens (or data.max_prompt_length)")


def test_too_many_new_tokens_is_a_warning_for_rotary_positions(caplog):
    with caplog.at_level(logging.WARNING):
        check_positions(tiny_qwen2(), max_new_tokens=120, prompt_tokens=8)    # 128: fits, no warning
        check_positions(tiny_qwen2(), max_new_tokens=10_000_000, prompt_tokens=8)
    assert [r.getMessage() for r in caplog.records] == [
        "warning: rollout.max_new_tokens=10000000 plus the longest prompt (8 tokens) needs 10000008 positions, past "
        "the model's max_position_embeddings=128: it was not trained on such lengths and may degrade (lower "
        "rollout.max_new_tokens or data.max_prompt_length)"]


def test_a_tokenizer_larger_than_the_embedding_is_an_error_naming_both_sizes():
    tok = build_tokenizer()
    check_vocabulary(tiny_gpt2(len(tok)), tok)
    check_vocabulary(tiny_gpt2(len(tok) + 8), tok)                              # padded embeddings are fine
    with pytest.raises(ValueError) as info:
        check_vocabulary(tiny_gpt2(len(tok) - 5), tok)
    assert str(info.value) == (f"the tokenizer has {len(tok)} tokens but the model's input embedding has "
                               f"{len(tok) - 5} rows: ids {len(tok) - 5}..{len(tok) - 1} would index past it (use the "
                               f"model's own tokenizer, or call model.resize_token_embeddings(len(tokenizer)))")


def test_temperature_zero_warns_that_there_is_no_learning_signal(caplog):
    tok = build_tokenizer()
    model = build_model(tok, "micro")
    with caplog.at_level(logging.WARNING):
        check_run(build_config(overrides={"rollout.temperature": 1.0}), model, tok, [])
        check_run(build_config(overrides={"rollout.temperature": 0.0, "rollout.num_generations": 4}), model, tok, [])
    assert [r.getMessage() for r in caplog.records] == [
        "warning: rollout.temperature=0 samples greedily: the 4 completions of a prompt are identical, their rewards "
        "tie and every advantage is 0 (no learning signal); use a temperature > 0"]


@pytest.mark.parametrize("over,model_fn,error,message", [
    ({"max_completion_length": 100}, lambda tok: tiny_gpt2(len(tok)), ConfigError,
     "rollout.max_new_tokens=100 plus the longest prompt"),
    ({}, lambda tok: tiny_gpt2(len(tok) - 1), ValueError, "the tokenizer has"),
])
def test_the_trainer_stops_before_writing_anything(tmp_path, over, model_fn, error, message):
    tok = build_tokenizer()
    config = {"max_steps": 1, "num_generations": 2, "max_completion_length": 6, "train.prompts_per_step": 2,
              "log.progress_bar": False, "cpu.num_threads": 1, "train.output_dir": str(tmp_path / "run"), **over}
    trainer = grpo.Trainer(model_fn(tok), reward_funcs=[digits], train_dataset=ROWS, tokenizer=tok, config=config)
    with pytest.raises(error, match=message):
        trainer.train()
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
