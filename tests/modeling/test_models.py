"""Tests for the character-level tokenizer, the local Qwen2 builders and policy loading."""

import json

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from grpo.modeling.models import (
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


# ---- any local causal LM: Llama, Qwen2, GPT-2 through load_policy, the sampler and the log-probs ----

from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM, Qwen2Config)

from grpo.modeling.logprobs import completion_logprobs  # noqa: E402
from grpo.modeling.models import check_model_dir, resolve_dtype  # noqa: E402
from grpo.rollout import sample  # noqa: E402
from grpo.rollout.params import Prompts, SamplingParams

PROMPTS = ["1+2=", "10+20+30=", "7*8=", "99-1+4*2="]  # different lengths -> left padding


def char_tokenizer_without_pad() -> PreTrainedTokenizerFast:
    """The character-level vocabulary with eos/unk but no pad token (GPT-2 style)."""
    backend = build_tokenizer().backend_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", unk_token="<|unk|>",
                                   padding_side="left", clean_up_tokenization_spaces=False)


def arch_config(kind: str, tok):
    """A 2-layer, hidden-32 config of architecture `kind` for the vocabulary of `tok`."""
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    decoder = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=128, **ids)
    configs = {
        "llama": lambda: LlamaConfig(**decoder),
        "qwen2": lambda: Qwen2Config(**decoder),
        "gpt2": lambda: GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, tie_word_embeddings=False, **ids),
    }
    return configs[kind]()


def save_tiny(kind: str, tok, directory, seed: int = 0):
    """Build a tiny random causal LM of `kind`, save it with `tok` to `directory`, return the model."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(arch_config(kind, tok)).eval()
    with torch.no_grad():  # sharper next-token distributions than a raw random init
        model.get_output_embeddings().weight.mul_(4.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return model


ARCHS = {"llama": (LlamaForCausalLM, build_tokenizer), "qwen2": (Qwen2ForCausalLM, build_tokenizer),
         "gpt2": (GPT2LMHeadModel, char_tokenizer_without_pad)}


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_load_policy_any_architecture(kind, tmp_path):
    cls, make_tok = ARCHS[kind]
    tok = make_tok()
    original = save_tiny(kind, tok, tmp_path)
    model, loaded_tok = load_policy(tmp_path)
    assert type(model) is cls and not model.training
    assert model.name_or_path == str(tmp_path.resolve())
    assert loaded_tok.padding_side == "left"
    expected_pad = tok.pad_token_id if tok.pad_token is not None else tok.eos_token_id
    assert loaded_tok.pad_token_id == model.config.pad_token_id == model.generation_config.pad_token_id == expected_pad
    assert model.generation_config.eos_token_id == loaded_tok.eos_token_id == tok.eos_token_id
    x = torch.tensor([tok(PROMPTS[1])["input_ids"]])
    assert torch.equal(model(x).logits, original(x).logits)


def test_gpt2_style_tokenizer_without_pad_falls_back_to_eos(tmp_path):
    tok = char_tokenizer_without_pad()
    assert tok.pad_token is None
    save_tiny("gpt2", tok, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()).get("pad_token_id") is None
    _, loaded_tok = load_policy(tmp_path)
    assert loaded_tok.pad_token == "<|endoftext|>" and loaded_tok.pad_token_id == tok.eos_token_id
    batch = loaded_tok(PROMPTS[:2], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, :5].tolist() == [tok.eos_token_id] * 5  # left-padded with eos
    assert batch["attention_mask"][0].tolist() == [0] * 5 + [1] * 4


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_sampler_and_logprobs_agree_on_any_architecture(kind, temperature, tmp_path):
    save_tiny(kind, ARCHS[kind][1](), tmp_path, seed=1)
    model, tok = load_policy(tmp_path)
    batch = tok(PROMPTS, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()
    params = SamplingParams(n=3, max_tokens=10, temperature=temperature, stop_token_ids=(tok.eos_token_id,), seed=0)
    gen = sample(model, Prompts(batch["input_ids"], batch["attention_mask"]), params, pad_token_id=tok.pad_token_id)
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)                      # [N, P + T]
    mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)                   # [N, P + T]
    T, on = gen.completion_ids.size(1), gen.completion_mask.bool()
    with torch.no_grad():
        logp, _ = completion_logprobs(model, ids, mask, T, temperature)           # [N, T]
    assert torch.allclose(logp[on], gen.sampling_logprobs[on], atol=1e-4)
    assert (gen.sampling_logprobs[on] < 0).all()
    # Left padding is invisible: row 0 (the shortest prompt is padded most) recomputed without padding.
    shortest = int(gen.prompt_mask.sum(1).argmin())
    real = torch.cat([gen.prompt_ids[shortest][gen.prompt_mask[shortest].bool()],
                      gen.completion_ids[shortest][on[shortest]]])[None]
    n = int(on[shortest].sum())
    with torch.no_grad():
        alone, _ = completion_logprobs(model, real, torch.ones_like(real), n, temperature)
    assert torch.allclose(alone[0], gen.sampling_logprobs[shortest, :n], atol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_load_policy_half_precision(dtype, tmp_path):
    save_tiny("llama", build_tokenizer(), tmp_path)
    model, _ = load_policy(tmp_path, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    assert resolve_dtype(dtype) is getattr(torch, dtype) and resolve_dtype(torch.float32) is torch.float32
    with pytest.raises(ValueError, match="unsupported dtype 'float64'"):
        load_policy(tmp_path, dtype="float64")


def test_load_policy_errors_are_one_line_and_name_the_path(tmp_path):
    not_model = tmp_path / "tokenizer-only"
    build_tokenizer().save_pretrained(not_model)
    with pytest.raises(FileNotFoundError, match="no config.json") as info:
        load_policy(not_model)
    assert str(not_model) in str(info.value) and "\n" not in str(info.value)
    no_tokenizer = tmp_path / "model-only"
    build_model(build_tokenizer(), "micro").save_pretrained(no_tokenizer)
    with pytest.raises(FileNotFoundError, match="no tokenizer files") as info:
        load_policy(no_tokenizer)
    assert str(no_tokenizer) in str(info.value)
    no_weights = tmp_path / "no-weights"
    save_tiny("qwen2", build_tokenizer(), no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="cannot load a causal LM") as info:
        load_policy(no_weights)
    assert str(no_weights) in str(info.value) and "\n" not in str(info.value)
    assert check_model_dir(no_weights) == no_weights.resolve()


CUSTOM_CONFIG = """from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny-custom"
"""
CUSTOM_MODEL = """from transformers import LlamaForCausalLM

from .configuration_tiny_custom import TinyCustomConfig


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
"""


def test_remote_code_runs_only_when_trusted(tmp_path, monkeypatch):
    import sys

    from transformers import dynamic_module_utils

    # Keep the copied custom code inside tmp_path instead of ~/.cache/huggingface/modules.
    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m.startswith("transformers_modules")]:
        monkeypatch.delitem(sys.modules, name)
    save_tiny("llama", build_tokenizer(), tmp_path)
    (tmp_path / "configuration_tiny_custom.py").write_text(CUSTOM_CONFIG)
    (tmp_path / "modeling_tiny_custom.py").write_text(CUSTOM_MODEL)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(model_type="tiny-custom", architectures=["TinyCustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_tiny_custom.TinyCustomConfig",
                            "AutoModelForCausalLM": "modeling_tiny_custom.TinyCustomForCausalLM"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_policy(tmp_path)
    model, _ = load_policy(tmp_path, trust_remote_code=True)
    assert type(model).__name__ == "TinyCustomForCausalLM"


def test_disable_dropout_zeroes_every_dropout_but_loras():
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    from grpo.config import build_config
    from grpo.modeling.lora import apply_lora
    from grpo.modeling.models import disable_dropout

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=32))  # p = 0.1
    before = sum(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in gpt2.modules())
    assert before > 0 and disable_dropout(gpt2) == before
    assert all(m.p == 0 for m in gpt2.modules() if isinstance(m, torch.nn.Dropout))
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32, attention_dropout=0.2))
    qwen = apply_lora(qwen, build_config(overrides={"lora.enabled": True, "lora.dropout": 0.1}).lora)
    assert disable_dropout(qwen) == 2                           # each layer's attention_dropout
    assert all(m.attention_dropout == 0.0 for m in qwen.modules() if hasattr(m, "attention_dropout"))
    lora = [m for n, m in qwen.named_modules() if isinstance(m, torch.nn.Dropout) and ".lora_dropout." in f".{n}."]
    assert lora and all(m.p == 0.1 for m in lora)               # lora.dropout is the user's explicit choice


def test_the_trainer_disables_dropout_unless_told_not_to(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    import grpo
    from grpo.modeling.models import build_tokenizer

    tok = build_tokenizer()
    rows = [{"prompt": "1+1=", "solution": "2"}] * 4

    def trainer(**over):
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=64))
        return grpo.Trainer(model, reward_funcs=["format"], train_dataset=rows, tokenizer=tok,
                            config={"train.output_dir": str(tmp_path / "o"), **over}).model

    rates = lambda m: {mod.p for mod in m.modules() if isinstance(mod, torch.nn.Dropout)}  # noqa: E731
    assert rates(trainer()) == {0.0}
    assert rates(trainer(**{"train.disable_dropout": False})) == {0.1}
