"""Reward models: a local single-label sequence classifier scores prompt + completion."""

import json

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    Qwen2Config,
    Qwen2ForSequenceClassification,
)

from grpo.modeling.models import build_model, build_tokenizer
from grpo.rewards import RewardError, load_reward, score
from grpo.rewards.reward_model import load_reward_model

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")
TEXT_PROMPTS = ["1+2=", "what is 10+20+30? ", "7*8=", "q: 99-1 "]
CHAT_PROMPTS = [[{"role": "user", "content": "1+2=?"}],
                [{"role": "system", "content": "be brief."}, {"role": "user", "content": "what is 10+20+30?"}],
                [{"role": "user", "content": "7*8"}],
                [{"role": "user", "content": "add 5 and 6"}]]
COMPLETIONS = ["3", "<think>10+20=30,30+30=60</think><answer>60</answer>", "fifty six", ""]
ARCHS = {"llama": (LlamaConfig, LlamaForSequenceClassification),
         "qwen2": (Qwen2Config, Qwen2ForSequenceClassification)}


def rm_tokenizer(max_length: int = 128):
    tok = build_tokenizer(model_max_length=max_length)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_rm(directory, kind: str = "llama", num_labels: int = 1, tok=None, pad_in_config: bool = True):
    """A tiny sequence classifier (2 layers, hidden 32) + tokenizer saved to `directory`."""
    tok = tok or rm_tokenizer()
    config_cls, model_cls = ARCHS[kind]
    torch.manual_seed(0)
    config = config_cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        num_labels=num_labels, pad_token_id=tok.pad_token_id if pad_in_config else None,
                        eos_token_id=tok.eos_token_id, bos_token_id=None)
    model = model_cls(config).eval()
    with torch.no_grad():  # spread the scores out
        model.score.weight.mul_(10.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@torch.no_grad()
def manual_score(directory, text: str, tok=None) -> float:
    """One unpadded text through the classifier, as a user would do it by hand."""
    tok = tok or rm_tokenizer()
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    return model(**tok(text, return_tensors="pt")).logits[0, 0].item()


def chat_text(tok, prompt, completion) -> str:
    return tok.apply_chat_template(prompt + [{"role": "assistant", "content": completion}], tokenize=False)


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_scores_equal_a_manual_forward_for_text_and_chat_prompts(kind, tmp_path):
    directory = save_rm(tmp_path / f"{kind}-rm", kind)
    name, fn = load_reward(str(directory))
    assert name == f"rm:{kind}-rm"
    tok = rm_tokenizer()
    text_scores = fn(TEXT_PROMPTS, COMPLETIONS, answer=["3", "60", "56", "11"])
    expected = [manual_score(directory, p + c) for p, c in zip(TEXT_PROMPTS, COMPLETIONS)]
    assert text_scores == pytest.approx(expected, abs=1e-5)
    chat_scores = fn(CHAT_PROMPTS, COMPLETIONS)
    assert chat_text(tok, CHAT_PROMPTS[0], "3") == "user: 1+2=?\nassistant: 3\n"
    expected_chat = [manual_score(directory, chat_text(tok, p, c)) for p, c in zip(CHAT_PROMPTS, COMPLETIONS)]
    assert chat_scores == pytest.approx(expected_chat, abs=1e-5)
    assert len(set(round(s, 4) for s in text_scores + chat_scores)) == 8  # distinct, real scores
    mixed = fn([TEXT_PROMPTS[0], CHAT_PROMPTS[1]], COMPLETIONS[:2])
    assert mixed == pytest.approx([expected[0], expected_chat[1]], abs=1e-5)


def test_batching_with_padding_equals_one_at_a_time(tmp_path):
    directory = save_rm(tmp_path / "rm")
    prompts, completions = TEXT_PROMPTS * 3, COMPLETIONS[::-1] * 3
    _, batched = load_reward_model(directory, batch_size=5)
    _, single = load_reward_model(directory, batch_size=1)
    assert batched.batch_size == 5
    assert batched(prompts, completions) == pytest.approx(single(prompts, completions), abs=1e-5)
    assert not batched.model.training and not any(p.requires_grad for p in batched.model.parameters())


def test_long_inputs_are_truncated_on_the_left(tmp_path):
    tok = rm_tokenizer(max_length=12)
    directory = save_rm(tmp_path / "rm", tok=tok)
    _, fn = load_reward(str(directory))
    prompt, completion = "a long prompt that does not fit: ", "12+34=46"
    kept = (prompt + completion)[-12:]  # one character per token
    assert fn([prompt], [completion]) == pytest.approx([manual_score(directory, kept)], abs=1e-5)


def test_missing_pad_id_in_config_falls_back_to_the_tokenizer(tmp_path):
    directory = save_rm(tmp_path / "rm", pad_in_config=False)
    assert json.loads((directory / "config.json").read_text()).get("pad_token_id") is None
    _, fn = load_reward_model(directory, batch_size=4)
    assert fn.model.config.pad_token_id == rm_tokenizer().pad_token_id
    _, one = load_reward_model(directory, batch_size=1)
    assert fn(TEXT_PROMPTS, COMPLETIONS) == pytest.approx(one(TEXT_PROMPTS, COMPLETIONS), abs=1e-5)


def test_reward_model_in_score(tmp_path):
    directory = save_rm(tmp_path / "rm")
    rm = load_reward(str(directory))
    scored = score([rm], [0.5], TEXT_PROMPTS, COMPLETIONS, {})
    expected = torch.tensor([manual_score(directory, p + c) for p, c in zip(TEXT_PROMPTS, COMPLETIONS)])
    assert scored.names == ["rm:rm"]
    assert torch.allclose(scored.total, 0.5 * expected, atol=1e-5)


def test_called_by_keyword_with_message_completions(tmp_path):
    directory = save_rm(tmp_path / "rm")
    _, fn = load_reward(str(directory))
    messages = [[{"role": "assistant", "content": c}] for c in COMPLETIONS[:2]]
    chat = fn(prompts=CHAT_PROMPTS[:2], completions=messages, completion_ids=[[1], [2]], answer=["3", "60"])
    assert chat == pytest.approx(fn(CHAT_PROMPTS[:2], COMPLETIONS[:2]), abs=1e-5)
    text = fn(prompts=TEXT_PROMPTS[:1], completions=messages[:1])   # after a text prompt: the message's content
    assert text == pytest.approx([manual_score(directory, TEXT_PROMPTS[0] + COMPLETIONS[0])], abs=1e-5)


def test_reward_model_errors(tmp_path):
    with pytest.raises(RewardError, match="num_labels=2"):
        load_reward(str(save_rm(tmp_path / "two-labels", num_labels=2)))
    causal = tmp_path / "causal"
    build_model(build_tokenizer(), "micro").save_pretrained(causal)
    with pytest.raises(RewardError, match="not a sequence-classification reward model"):
        load_reward(str(causal))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RewardError, match="no config.json"):
        load_reward(str(tmp_path / "empty"))
    no_template = tmp_path / "no-template"
    save_rm(no_template, tok=build_tokenizer())
    _, fn = load_reward(str(no_template))
    with pytest.raises(RewardError, match="chat template"):
        fn(CHAT_PROMPTS[:1], ["3"])


def test_scores_ignore_the_policys_autocast(tmp_path):
    """Under the trainer's bf16 autocast (train.precision) a float32 reward model still scores in float32."""
    directory = save_rm(tmp_path / "rm")
    _, fn = load_reward_model(directory)
    plain = fn(TEXT_PROMPTS, COMPLETIONS)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert fn(TEXT_PROMPTS, COMPLETIONS) == plain
        assert torch.is_autocast_enabled("cpu")                       # restored for the policy's passes


def test_a_loaded_classifier_in_reward_funcs_scores_like_its_directory(tmp_path):
    """TRL's reward_funcs=[AutoModelForSequenceClassification...]: the object, with its tokenizer from
    reward_processing_classes or from beside it, scores what the same model loaded from its directory does."""
    from grpo.api.inputs import resolve_rewards
    from grpo.config import ConfigError, build_config

    directory = save_rm(tmp_path / "rm")
    model = AutoModelForSequenceClassification.from_pretrained(directory)
    expected = [manual_score(directory, p + c) for p, c in zip(TEXT_PROMPTS, COMPLETIONS)]
    cfg = build_config()
    for tokenizers in (None, rm_tokenizer(), [rm_tokenizer(), None]):
        funcs = [model, "format"] if isinstance(tokenizers, list) else model
        rewards, _ = resolve_rewards(funcs, cfg, tokenizers)
        assert rewards[0][0] == "rm:rm"
        assert rewards[0][1](prompts=TEXT_PROMPTS, completions=COMPLETIONS) == pytest.approx(expected, abs=1e-5)
    in_memory = Qwen2ForSequenceClassification(Qwen2Config(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, num_key_value_heads=1,
                                                           intermediate_size=32, num_labels=1))
    with pytest.raises(RewardError, match="no tokenizer given and none saved beside it"):
        resolve_rewards(in_memory, cfg)
    with pytest.raises(RewardError, match="num_labels=3; a reward model needs exactly 1"):
        resolve_rewards(AutoModelForSequenceClassification.from_pretrained(save_rm(tmp_path / "rm3", num_labels=3)), cfg)
    with pytest.raises(ConfigError, match="reward_processing_classes has 1 entries for 2 reward_funcs"):
        resolve_rewards([model, "format"], cfg, [rm_tokenizer()])


def test_place_reward_models_moves_only_reward_models(tmp_path):
    """The trainer and `grpo eval` / `grpo sample --device` put reward models on the policy's device (as TRL's
    accelerator does); plain functions are left alone, and a model already there is not counted."""
    from grpo.rewards.reward_model import place_reward_models

    save_rm(tmp_path / "rm")
    rm = load_reward(str(tmp_path / "rm"))
    rewards = [rm, ("plain", lambda completions, **kw: [0.0] * len(completions))]
    assert place_reward_models(rewards, torch.device("cpu")) == 0
    assert place_reward_models(rewards, torch.device("meta")) == 1
    assert {p.device.type for p in rm[1].model.parameters()} == {"meta"}
