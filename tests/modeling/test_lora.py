"""LoRA through peft: only adapters train, the adapter-disabled model is the reference policy."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from grpo.config import ConfigError, build_config
from grpo.modeling.logprobs import completion_logprobs
from grpo.modeling.reference import AdapterDisabled, FrozenCopy, build_reference
from grpo.modeling.lora import (apply_lora, base_model_path, is_lora, peft_lora_config,
                       trainable_parameter_names)
from grpo.rollout import sample
from grpo.rollout.params import Prompts, SamplingParams
from tests.conftest import tiny_qwen2

VOCAB = 32


def lora_cfg(**over):
    flat = {"lora.enabled": True, "lora.r": 4, "lora.alpha": 8, "lora.dropout": 0.0, **over}
    return build_config(overrides=flat).lora


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0,
                     eos_token_id=1, bos_token_id=None)
    return GPT2LMHeadModel(cfg).eval()


MODELS = {"qwen2": tiny_qwen2, "gpt2": tiny_gpt2}


def batch(seed: int = 0, n: int = 4, length: int = 12):
    """Random sequences, rows 1.. left-padded by 1.. tokens. -> ids, mask [n, length]"""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (n, length), generator=g)
    mask = (torch.arange(length)[None] >= torch.arange(n)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


@torch.no_grad()
def logps(model, ids, mask, T: int = 6) -> torch.Tensor:
    return completion_logprobs(model.eval(), ids, mask, T)[0]


def train_steps(model, steps: int = 5, lr: float = 1e-2) -> None:
    """A few AdamW steps raising the log-likelihood of random sequences (trainable params only)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids, mask = batch(seed=1)
    model.train()
    for _ in range(steps):
        loss = -completion_logprobs(model, ids, mask, 6)[0].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_lora_at_init_is_the_base_model_and_training_moves_only_adapters(kind):
    base = MODELS[kind]()
    snapshot = copy.deepcopy(base)
    base_weights = {k: v.clone() for k, v in base.state_dict().items()}
    ids, mask = batch()
    expected = logps(snapshot, ids, mask)
    model = apply_lora(base, lora_cfg())
    assert is_lora(model) and not is_lora(snapshot)
    trainable = trainable_parameter_names(model)
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    # B = 0 at init: adapters on or off, the model is the base model.
    assert torch.equal(logps(model, ids, mask), expected)
    ref = build_reference(model, beta=0.04)                                     # adapters disabled, no copy
    assert isinstance(ref, AdapterDisabled) and ref.policy is model
    assert torch.allclose(ref.logprobs(ids, mask, 6, 1.0), expected, atol=1e-6)

    train_steps(model)
    assert (logps(model, ids, mask) - expected).abs().max() > 1e-2              # the policy moved
    assert torch.allclose(ref.logprobs(ids, mask, 6, 1.0), expected, atol=1e-6)   # the reference did not
    assert (logps(model, ids, mask) - expected).abs().max() > 1e-2              # adapters back on after the pass
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    unmerged = model.get_base_model().state_dict()
    for key, value in base_weights.items():  # frozen base weights, bit for bit
        peft_key = key if key in unmerged else key.replace(".weight", ".base_layer.weight").replace(
            ".bias", ".base_layer.bias")
        assert torch.equal(unmerged[peft_key], value), key
    assert any(not torch.equal(merged[k], base_weights[k]) for k in base_weights)


def test_adapter_reference_restores_adapters_on_error_and_needs_lora(monkeypatch):
    import grpo.modeling.reference as reference

    model = apply_lora(tiny_qwen2(), lora_cfg())
    train_steps(model, steps=2)
    ids, mask = batch()
    policy = logps(model, ids, mask)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(reference, "fixed_logprobs", boom)                     # fails with adapters off
    with pytest.raises(RuntimeError, match="boom"):
        build_reference(model, beta=0.04).logprobs(ids, mask, 6, 1.0)
    assert torch.equal(logps(model, ids, mask), policy)                          # adapters back on
    assert isinstance(build_reference(tiny_qwen2(), beta=0.04), FrozenCopy)     # no LoRA: a frozen copy


def test_target_modules_and_peft_config():
    cfg = peft_lora_config(lora_cfg(**{"lora.r": 2, "lora.alpha": 6, "lora.dropout": 0.1}))
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.target_modules) == (2, 6, 0.1, "all-linear")
    model = apply_lora(tiny_qwen2(), lora_cfg(**{"lora.target_modules": ["q_proj", "v_proj"]}))
    names = trainable_parameter_names(model)
    assert len(names) == 2 * 2 * 2  # 2 layers x {q, v} x {A, B}
    assert all(".q_proj." in n or ".v_proj." in n for n in names)
    everything = trainable_parameter_names(apply_lora(tiny_qwen2(), lora_cfg()))
    assert not any("lm_head" in n or "embed" in n for n in everything)  # all-linear skips the output head
    assert len(everything) == 2 * 7 * 2  # q k v o gate up down in each of 2 layers
    with pytest.raises(ValueError, match="lora.target_modules"):
        apply_lora(tiny_qwen2(), lora_cfg(**{"lora.target_modules": ["no_such_layer"]}))
    with pytest.raises(ValueError, match="already"):
        apply_lora(model, lora_cfg())


def test_one_target_with_regex_characters_is_a_regex_on_the_full_name():
    """peft's string form: '.*layers\\.0\\..*proj' adapts layer 0 only; plain and dotted names match name suffixes."""
    assert peft_lora_config(lora_cfg(**{"lora.target_modules": [r".*layers\.0\..*proj"]})).target_modules == \
        r".*layers\.0\..*proj"
    names = trainable_parameter_names(apply_lora(tiny_qwen2(), lora_cfg(**{"lora.target_modules": [r".*layers\.0\..*proj"]})))
    assert len(names) == 7 * 2 and all(".layers.0." in n for n in names)
    dotted = trainable_parameter_names(apply_lora(tiny_qwen2(), lora_cfg(**{"lora.target_modules": ["self_attn.q_proj"]})))
    assert len(dotted) == 2 * 2 and all(".q_proj." in n for n in dotted)


def test_base_path_is_recorded(tmp_path):
    base = tiny_qwen2()
    assert base_model_path(apply_lora(copy.deepcopy(base), lora_cfg())) is None  # built in memory: unknown
    model = apply_lora(base, lora_cfg(), base_path=tmp_path)
    assert base_model_path(model) == str(tmp_path.resolve())


def test_lora_config_keys_and_validation():
    defaults = build_config().lora
    assert (defaults.enabled, defaults.r, defaults.alpha, defaults.dropout, defaults.target_modules) == (
        False, 16, 32, 0.0, ["all-linear"])
    assert build_config(overrides={"lora.target_modules": "q_proj"}).lora.target_modules == ["q_proj"]
    bad = {"lora.r": 0, "lora.alpha": 0, "lora.dropout": 1.0, "lora.target_modules": [],
           "lora.enabled": "yes"}
    for key, value in bad.items():
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            build_config(overrides={key: value})
    with pytest.raises(ConfigError, match="all-linear"):
        build_config(overrides={"lora.target_modules": ["all-linear", "q_proj"]})


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_sampler_on_lora_model_keeps_logits_to_keep_and_matches_logprobs(kind):
    model = apply_lora(MODELS[kind](), lora_cfg())
    train_steps(model, steps=3)
    seen = []
    model.get_base_model().register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw.get("logits_to_keep")), with_kwargs=True)
    ids, mask = batch(n=3, length=6)
    gen = sample(model, Prompts(ids, mask),
                 SamplingParams(n=2, max_tokens=5, stop_token_ids=(1,), seed=0), pad_token_id=0)
    assert seen and all(k == 1 for k in seen)  # only the last position goes through the LM head
    full_ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
    full_mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
    on = gen.completion_mask.bool()
    recomputed = logps(model, full_ids, full_mask, gen.completion_ids.size(1))
    assert torch.allclose(recomputed[on], gen.sampling_logprobs[on], atol=1e-5)


def test_apply_lora_hides_peft_s_deprecated_property_warning_only():
    """peft reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model; that
    FutureWarning is hidden (it printed before every LoRA run's output), other warnings still pass."""
    import warnings

    from grpo.modeling.lora import quiet_peft

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(tiny_qwen2(), lora_cfg())
        with quiet_peft():
            warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning)
            warnings.warn("something else", FutureWarning)
    messages = [str(w.message) for w in caught]
    assert not any("is_gradient_checkpointing" in m for m in messages), messages
    assert "something else" in messages
