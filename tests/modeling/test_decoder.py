"""Tests for grpo.modeling.decoder: the lean decode path against Hugging Face's own forward."""

import peft
import pytest
import torch
import transformers

from grpo.rollout import sample
from grpo.cpu import native_gemm
from grpo.modeling.decoder import lean_decoder
from grpo.modeling.decoder import positions_from_mask
from grpo.rollout.sampler import prefill
from grpo.rollout.params import Prompts, SamplingParams
from tests.rollout.test_rollout import make_prompts, sampled_eos  # same VOCAB and PAD

VOCAB = 64
PAD = 0
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128)
CONFIGS = {
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE, attention_bias=True)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SHAPE, sliding_window=None)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SHAPE, head_dim=24)),
    "qwen2-lora": lambda: with_lora(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE))),
}
UNSUPPORTED = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, tie_word_embeddings=False)),
    "qwen2-sliding": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SHAPE, use_sliding_window=True, sliding_window=3, max_window_layers=0)),
    "mistral-sliding": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SHAPE, sliding_window=3)),
}


def with_lora(model):
    """A peft LoRA wrapper on every projection, with non-zero B so the adapters change the output."""
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"])
    model = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    return model


def make_model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    model = {**CONFIGS, **UNSUPPORTED}[kind]()
    with torch.no_grad():  # sharpen the random model a little so completions are not uniform noise
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()


def last_logits(model, ids, mask):
    """Next-token logits of a cache-free full forward. [n, L] -> [n, V]"""
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=False)
    return out.logits[:, -1].float()


def packing(monkeypatch, pack):
    """The rollout's weights for `pack`: native (grpo's decode kernel, skipped where it cannot run), onednn, or
    None (not packed: CUDA's and autocast dtypes' path). Returns the packed weights' type check."""
    from grpo.cpu.hooks import CpuRolloutWeights

    if pack == "native" and native_gemm.library() is None:
        pytest.skip(f"native decode kernel: {native_gemm.unavailable_reason()}")
    monkeypatch.setitem(native_gemm._modes, "decode", "native" if pack == "native" else "onednn")
    if pack is None:                                   # the rollout hook packs nothing (as off the CPU)
        monkeypatch.setattr(CpuRolloutWeights, "pack_rows", lambda *a: None)
    return {"native": lambda w: type(w) is native_gemm.PanelWeight, "onednn": lambda w: w.is_mkldnn,
            None: lambda w: type(w) is not native_gemm.PanelWeight and not w.is_mkldnn}[pack]


@pytest.mark.parametrize("pack", ["native", "onednn", None])
@pytest.mark.parametrize("kind", list(CONFIGS))
@torch.no_grad()
def test_decode_steps_match_full_forward(kind, pack, monkeypatch):
    """Several lean decode steps (with rows dropped mid-way) == a full forward over the whole sequence, with
    the rollout's weights packed for the native kernel (CPU float32's default on AVX-512), oneDNN-packed and
    not packed (CUDA, autocast dtypes)."""
    packed = packing(monkeypatch, pack)
    model = make_model(kind)
    decoder = lean_decoder(model)
    assert decoder is not None
    ids, mask = make_prompts()
    G, steps = 2, 6
    logits, cache = prefill(model, ids, mask)  # [B, V]
    state = decoder.start(cache, mask, G, steps)
    assert (state.head is not None) == (pack is not None) and (pack is None or packed(state.head))
    if kind != "qwen2-lora":  # LoRA-adapted projections keep their modules
        assert all(packed(w) for f in state.fused for w in (f.qkv, f.gate_up, f.o, f.down))
    seq, seq_mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)  # [N, P]
    gen = torch.Generator().manual_seed(0)
    for t in range(steps):
        if t == 3:  # compaction: rows 1 and 4 finish
            kept = torch.tensor([0, 2, 3, 5])
            state.select(kept)
            seq, seq_mask = seq[kept], seq_mask[kept]
        tokens = torch.randint(1, VOCAB, (seq.size(0),), generator=gen)  # [n]
        seq = torch.cat([seq, tokens[:, None]], 1)
        seq_mask = torch.cat([seq_mask, torch.ones_like(tokens)[:, None]], 1)
        lean = decoder.step(state, tokens).float()  # [n, V]
        torch.testing.assert_close(lean, last_logits(model, seq, seq_mask), atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("pack", ["native", "onednn", None])
def test_decode_step_runs_a_plain_lm_head_through_the_cpu_kernel(monkeypatch, pack):
    """The LM head of a decode step goes through grpo.cpu.kernels.linear, like the projections: as this
    rollout's packed copy on CPU float32 (native or oneDNN), else as the head's own weight."""
    import grpo.cpu.hooks as cpu_hooks

    packed = packing(monkeypatch, pack)
    model = make_model("qwen2")
    decoder = lean_decoder(model)
    ids, mask = make_prompts()
    state = decoder.start(prefill(model, ids, mask)[1], mask, 2, 2)
    assert (state.head is not None) == (pack is not None) and (pack is None or packed(state.head))
    weights = []
    real = cpu_hooks.linear                              # the CPU runtime's rollout hook multiplies through it
    monkeypatch.setattr(cpu_hooks, "linear", lambda x, w, b=None: weights.append(w) or real(x, w, b))
    logits = decoder.step(state, torch.ones(state.num_rows, dtype=torch.long))
    assert any(w is (state.head if pack else model.lm_head.weight) for w in weights)
    assert logits.shape == (state.num_rows, VOCAB)


@pytest.mark.parametrize("kind", list(CONFIGS))
@torch.no_grad()
def test_decode_steps_under_bf16_autocast_match_hf_forward(kind):
    """train.precision bf16: the lean decoder (its projections through oneDNN-switched linears) under
    autocast == the Hugging Face full forward under autocast, within bfloat16 rounding: both differ
    from float32 by about as much as from each other (~0.01 on logits of ~2)."""
    from grpo.cpu.placement import use_cpu_matmul

    model = make_model(kind)
    use_cpu_matmul(model, "onednn")
    decoder = lean_decoder(model)
    ids, mask = make_prompts()
    G, steps = 2, 4
    gen = torch.Generator().manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, cache = prefill(model, ids, mask)  # [B, V]
        state = decoder.start(cache, mask, G, steps)
        seq, seq_mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)  # [N, P]
        for _ in range(steps):
            tokens = torch.randint(1, VOCAB, (seq.size(0),), generator=gen)  # [n]
            seq = torch.cat([seq, tokens[:, None]], 1)
            seq_mask = torch.cat([seq_mask, torch.ones_like(tokens)[:, None]], 1)
            lean = decoder.step(state, tokens)  # [n, V]
            hf = last_logits(model, seq, seq_mask)
            with torch.autocast("cpu", enabled=False):
                exact = last_logits(model, seq, seq_mask)  # float32
            assert lean.dtype is torch.bfloat16  # the LM head ran in bfloat16
            torch.testing.assert_close(lean.float(), hf, atol=0.06, rtol=0)
            assert 0 < (lean.float() - exact).abs().max() < 0.1
        # the cache stays in the float32 model's dtype (keys leave rotary in cos / sin's float32; the planner's
        # kv_cache_bytes counts 4 bytes a value under any autocast)
        assert {t.dtype for t in (*state.keys, *state.values, *state.prompt_keys, *state.prompt_values)} == {torch.float32}


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 6, 0.9)])
def test_lean_sampling_equals_hf_path(kind, temperature, top_k, top_p):
    model = make_model(kind)
    ids, mask = make_prompts()
    params = SamplingParams(n=4, max_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)
    params = sampled_eos(model, Prompts(ids, mask), params, 2)  # row 0 (at least) stops early: rows are dropped
    lean = sample(model, Prompts(ids, mask), params, pad_token_id=PAD)
    hf = sample(model, Prompts(ids, mask), params, pad_token_id=PAD, lean=False)
    assert torch.equal(lean.completion_ids, hf.completion_ids)
    assert torch.equal(lean.completion_mask, hf.completion_mask)
    assert torch.equal(lean.truncated, hf.truncated)
    assert (lean.completion_mask == 0).any()
    torch.testing.assert_close(lean.sampling_logprobs, hf.sampling_logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_lean_greedy_matches_generate(kind):
    model = make_model(kind)
    ids, mask = make_prompts()
    G = 2
    gen = sample(model, Prompts(ids, mask),
                 SamplingParams(n=G, max_tokens=8, temperature=0, stop_token_ids=(VOCAB + 1,)), pad_token_id=PAD)
    ref = model.generate(input_ids=ids.repeat_interleave(G, 0), attention_mask=mask.repeat_interleave(G, 0),
                         do_sample=False, max_new_tokens=8, eos_token_id=VOCAB + 1, pad_token_id=PAD)
    assert torch.equal(gen.completion_ids, ref[:, ids.size(1):])


@pytest.mark.parametrize("kind", list(UNSUPPORTED))
def test_unsupported_models_fall_back_to_hf_forward(kind):
    model = make_model(kind)
    assert lean_decoder(model) is None
    ids, mask = make_prompts()
    gen = sample(model, Prompts(ids, mask),
                 SamplingParams(n=2, max_tokens=6, temperature=0, stop_token_ids=(VOCAB + 1,)), pad_token_id=PAD)
    ref = model.generate(input_ids=ids.repeat_interleave(2, 0), attention_mask=mask.repeat_interleave(2, 0),
                         do_sample=False, max_new_tokens=6, eos_token_id=VOCAB + 1, pad_token_id=PAD)
    assert torch.equal(gen.completion_ids, ref[:, ids.size(1):])


def test_unexpected_layout_and_prompt_learning_fall_back():
    model = make_model("llama")
    model.model.layers[0].self_attn.q_norm = torch.nn.Identity()  # a head norm Llama's math does not have
    assert lean_decoder(model) is None
    prompt_tuned = peft.get_peft_model(make_model("qwen2"), peft.PromptTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=2))
    assert lean_decoder(prompt_tuned) is None


def test_cache_keyword_follows_the_forward_signature():
    from grpo.modeling.decoder import cache_inputs, returned_cache

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None): ...

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None): ...

    assert cache_inputs(New(), "c") == {"cache": "c"} and cache_inputs(Old(), "c") == {"past_key_values": "c"}
    model = make_model("qwen2")
    out = model(input_ids=torch.ones(1, 3, dtype=torch.long), use_cache=True)
    assert returned_cache(out) is not None


def test_sampling_raises_no_cache_deprecation_warning():
    import warnings

    ids, mask = make_prompts()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        for m in (make_model("gpt2"), make_model("qwen2")):   # the model's own forward, then the lean decoder
            sample(m, Prompts(ids, mask),
                   SamplingParams(n=2, max_tokens=3, stop_token_ids=(1,), seed=0), pad_token_id=PAD)
