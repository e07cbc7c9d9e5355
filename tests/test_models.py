"""Tests for the character-level tokenizer, the local Qwen2 builders and policy loading."""

import json

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from grpo.models import (
    EMBEDDED_MODEL_DIR,
    TAG_TOKENS,
    build_model,
    build_tokenizer,
    count_parameters,
    load_policy,
    load_tokenizer,
)

TASK_STRINGS = [
    "47+28-19=",
    "47+28-19=<think>47+28=75,75-19=56</think><answer>56</answer>",
    "12-30+5=<think></think><answer>-13</answer>",
    "a b\nc, (x): y; z! 'q' \"w\" 3*4/2=6.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tokenizer_is_character_level_round_trip(tokenizer):
    for s in TASK_STRINGS:
        ids = tokenizer(s, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == s
        assert tokenizer.decode(ids, skip_special_tokens=True) == s
    assert tokenizer("1+2=", add_special_tokens=False)["input_ids"] == [
        tokenizer.convert_tokens_to_ids(c) for c in "1+2="
    ]


def test_tags_and_specials(tokenizer):
    for tag in TAG_TOKENS:
        ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == tag
    ids = tokenizer("<think></think><answer>7</answer>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.padding_side == "left"
    # No bos/eos is added implicitly, and specials are dropped on skip_special_tokens.
    assert tokenizer("12")["input_ids"] == tokenizer("12", add_special_tokens=False)["input_ids"]
    ids = tokenizer("5<|endoftext|>", add_special_tokens=False)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "5"
    assert len(tokenizer) < 100


def test_left_padding(tokenizer):
    batch = tokenizer(["1+2=", "10+20+30="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, :5].tolist() == [tokenizer.pad_token_id] * 5
    assert batch["attention_mask"][0].tolist() == [0] * 5 + [1] * 4


def test_tokenizer_save_load_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for s in TASK_STRINGS:
        assert loaded(s)["input_ids"] == tokenizer(s)["input_ids"]
        assert loaded.decode(loaded(s)["input_ids"]) == s
    for tag in TAG_TOKENS:
        assert len(loaded(tag, add_special_tokens=False)["input_ids"]) == 1
    assert loaded.padding_side == "left" and loaded.pad_token == "<|pad|>"


def test_model_sizes_and_config(tokenizer):
    micro = build_model(tokenizer, "micro")
    assert isinstance(micro, Qwen2ForCausalLM)
    assert count_parameters(micro) < 100_000
    small = build_model(tokenizer, "small")
    assert 500_000 < count_parameters(small) < 5_000_000
    for model in (micro, small):
        assert model.config.vocab_size == len(tokenizer)
        assert model.config.pad_token_id == tokenizer.pad_token_id
        assert model.config.eos_token_id == tokenizer.eos_token_id
        assert model.generation_config.eos_token_id == tokenizer.eos_token_id
        assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    with pytest.raises(ValueError):
        build_model(tokenizer, "huge")


def test_build_model_is_seeded(tokenizer):
    a, b, c = (build_model(tokenizer, "micro", seed=s) for s in (0, 0, 1))
    x = torch.tensor([tokenizer("1+2=")["input_ids"]])
    assert torch.equal(a(x).logits, b(x).logits)
    assert not torch.equal(a(x).logits, c(x).logits)


def test_load_policy_round_trip(tokenizer, tmp_path):
    model = build_model(tokenizer, "micro", seed=3)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(tmp_path)
    assert not loaded.training
    assert loaded_tok.padding_side == "left"
    # transformers 5 would otherwise turn a qwen2 checkpoint's tokenizer into byte-level BPE.
    for s in TASK_STRINGS:
        assert loaded_tok(s)["input_ids"] == tokenizer(s)["input_ids"]
        assert loaded_tok.decode(loaded_tok(s)["input_ids"]) == s
    x = torch.tensor([tokenizer(TASK_STRINGS[1])["input_ids"]])
    assert torch.allclose(loaded(x).logits, model(x).logits)
    assert loaded.dtype == torch.float32
    half, _ = load_policy(tmp_path, dtype="bfloat16")
    assert half.dtype == torch.bfloat16


def test_load_policy_missing_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_policy(missing)


def test_pad_token_falls_back_to_eos(tmp_path):
    vocab = {"<|endoftext|>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    no_pad = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", unk_token="<unk>")
    assert no_pad.pad_token is None
    no_pad.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "pad_token" not in config or config["pad_token"] is None
    model = build_model(no_pad, "micro")
    model.save_pretrained(tmp_path)
    _, loaded_tok = load_policy(tmp_path)
    assert loaded_tok.pad_token == "<|endoftext|>"
    assert loaded_tok.pad_token_id == loaded_tok.eos_token_id == 0
    assert loaded_tok.padding_side == "left"
    assert loaded_tok.decode(loaded_tok("12+3=")["input_ids"]) == "12+3="


def test_left_padded_generation_matches_unpadded(tokenizer):
    model = build_model(tokenizer, "micro", seed=0).eval()
    prompts = ["1+2=", "10+20+30="]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=6, do_sample=False)
    for i, prompt in enumerate(prompts):
        single = tokenizer([prompt], return_tensors="pt")
        alone = model.generate(**single, max_new_tokens=6, do_sample=False)
        assert out[i, batch["input_ids"].shape[1]:].tolist() == alone[0, single["input_ids"].shape[1]:].tolist()


@pytest.mark.skipif(not (EMBEDDED_MODEL_DIR / "config.json").is_file(), reason="embedded checkpoint not built")
def test_embedded_checkpoint_loads():
    model, tok = load_policy(EMBEDDED_MODEL_DIR)
    assert isinstance(model, Qwen2ForCausalLM)
    assert tok.decode(tok(TASK_STRINGS[1])["input_ids"]) == TASK_STRINGS[1]
    total = sum(p.stat().st_size for p in EMBEDDED_MODEL_DIR.iterdir() if p.is_file())
    assert total <= 20 * 1024 * 1024
