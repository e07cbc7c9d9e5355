"""The chunked log-prob path (backbone -> LM head chunk by chunk) against the model's own logits."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from grpo.config import build_config
from grpo.modeling.logprobs import (bucketed_micro_batches, chunked_path, completion_logprobs, fixed_logprobs, logits_path,
                           split_model, trim_padding)
from grpo.modeling.lora import apply_lora
from tests.conftest import tiny_qwen2

VOCAB = 40
P, T = 5, 6


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0,
                     eos_token_id=1, bos_token_id=None)
    return GPT2LMHeadModel(cfg)


def lora_qwen2():
    cfg = build_config(overrides={"lora.enabled": True, "lora.r": 4, "lora.alpha": 8}).lora
    model = apply_lora(tiny_qwen2(VOCAB), cfg)
    with torch.no_grad():                       # non-zero adapters, so the LoRA branch matters
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model


MODELS = {"qwen2": lambda: tiny_qwen2(VOCAB), "gpt2": tiny_gpt2, "lora": lora_qwen2}


def padded_batch(seed: int = 0):
    """6 rows: left-padded prompts (2 rows by 2 columns), completions of lengths 6,1,3,6,2,4.

    Shape: ids, mask [6, P + T]
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (6, P + T), generator=g)
    mask = torch.ones(6, P + T, dtype=torch.long)
    mask[0, :2] = 0
    mask[3, :1] = 0
    lengths = torch.tensor([6, 1, 3, 6, 2, 4])
    mask[:, P:] = (torch.arange(T)[None] < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def values_and_grads(model, fn, ids, mask, temperature, entropy_grad):
    """Loss = sum of masked log-probs (+ entropies); returns (logp, entropy, grads) on real tokens."""
    model.zero_grad(set_to_none=True)
    model.eval()                                # no dropout (GPT-2); autograd works in eval mode too
    logp, ent = fn(model, ids, mask, temperature, entropy_grad)
    on = mask[:, -T:].bool()
    loss = (logp * on).sum() + ((ent * on).sum() if entropy_grad else 0.0)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logp[on].detach(), ent[on].detach(), grads


def via_logits(model, ids, mask, temperature, entropy_grad):
    return logits_path(model, ids, mask, T, temperature, with_entropy=True, entropy_grad=entropy_grad)


def via_chunks(chunk):
    def run(model, ids, mask, temperature, entropy_grad):
        return chunked_path(split_model(model), ids, mask, T, temperature, with_entropy=True,
                            entropy_grad=entropy_grad, chunk_size=chunk)
    return run


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("temperature,entropy_grad", [(1.0, False), (0.7, True)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_values_and_gradients_equal_the_full_logits(kind, temperature, entropy_grad, dtype):
    """float64: equal within 1e-6 absolute; float32: only the summation order differs (1e-5)."""
    model = MODELS[kind]().to(dtype)
    assert split_model(model) is not None
    ids, mask = padded_batch()
    ref = values_and_grads(model, via_logits, ids, mask, temperature, entropy_grad)
    assert ref[2].abs().sum() > 0 and ref[0].dtype == dtype
    tol = dict(atol=1e-6, rtol=0) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    for chunk in (1, 3, 7, 1000):
        got = values_and_grads(model, via_chunks(chunk), ids, mask, temperature, entropy_grad)
        for a, b in zip(ref, got):
            assert torch.allclose(a, b, **tol), (chunk, (a - b).abs().max())


def test_chunked_path_is_the_default_and_zero_on_padding():
    model = tiny_qwen2(VOCAB)
    ids, mask = padded_batch()
    logp, ent = completion_logprobs(model, ids, mask, T, with_entropy=True)
    full, full_ent = logits_path(model, ids, mask, T, 1.0, True, False)
    on = mask[:, P:].bool()
    assert torch.allclose(logp[on], full[on], atol=1e-6) and torch.allclose(ent[on], full_ent[on], atol=1e-6)
    assert (logp[~on] == 0).all() and (ent[~on] == 0).all()
    assert (logp[on] < 0).all() and (ent[on] > 0).all()


def test_lm_head_never_sees_more_than_one_chunk_nor_padding():
    model = tiny_qwen2(VOCAB)
    ids, mask = padded_batch()
    rows, calls = [], []
    h1 = model.lm_head.register_forward_hook(lambda m, a, out: rows.append(out.shape))
    h2 = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        logp, _ = completion_logprobs(model.train(), ids, mask, T, chunk_size=4)
        logp.sum().backward()
    finally:
        h1.remove(), h2.remove()
    real = int(mask[:, P:].sum())                                   # 22 real completion tokens
    assert calls == []                                              # the full CausalLM forward never ran
    assert all(len(s) == 2 and s[0] <= 4 and s[1] == VOCAB for s in rows)
    forward_rows = real                                             # forward: each real token once
    assert sum(s[0] for s in rows) == 2 * forward_rows              # + one recompute in the backward pass


def test_trim_padding_drops_only_all_padding_columns():
    ids, mask = padded_batch()
    wide_ids = torch.cat([torch.zeros(6, 3, dtype=torch.long), ids, torch.zeros(6, 4, dtype=torch.long)], 1)
    wide_mask = torch.cat([torch.zeros(6, 3, dtype=torch.long), mask, torch.zeros(6, 4, dtype=torch.long)], 1)
    t_ids, t_mask, kept = trim_padding(wide_ids, wide_mask, T + 4)
    assert kept == T and torch.equal(t_ids, ids) and torch.equal(t_mask, mask)
    short = mask.clone()
    short[:, -2:] = 0                                               # no row uses the last 2 completion columns
    assert trim_padding(ids, short, T)[2] == T - 2
    assert trim_padding(ids[1:2], mask[1:2], T)[2] == 1             # a 1-token completion


@pytest.mark.parametrize("kind", ["qwen2", "lora"])
def test_trimming_padding_gives_identical_losses_and_gradients(kind):
    model = MODELS[kind]()
    ids, mask = padded_batch()
    pad_l, pad_r = torch.zeros(6, 3, dtype=torch.long), torch.zeros(6, 4, dtype=torch.long)
    wide_ids, wide_mask = torch.cat([pad_l, ids, pad_r], 1), torch.cat([pad_l, mask, pad_r], 1)

    def run(i, m, width):
        model.zero_grad(set_to_none=True)
        logp, _ = completion_logprobs(model.train(), i, m, width)
        loss = (logp[:, :T] * mask[:, P:]).sum()
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    loss_a, grad_a = run(ids, mask, T)
    loss_b, grad_b = run(wide_ids, wide_mask, T + 4)
    assert torch.allclose(loss_a, loss_b, atol=1e-6) and torch.allclose(grad_a, grad_b, atol=1e-6)
    ref, _ = logits_path(model, wide_ids, wide_mask, T + 4, 1.0, False, False)     # untrimmed model forward
    assert torch.allclose(loss_a, (ref[:, :T] * mask[:, P:]).sum(), atol=1e-5)


def test_fixed_logprobs_bucketed_micro_batches_keep_row_order():
    model = tiny_qwen2(VOCAB)
    ids, mask = padded_batch()
    full = fixed_logprobs(model, ids, mask, T)
    for mb in (1, 2, 4):
        assert torch.allclose(fixed_logprobs(model, ids, mask, T, micro_batch_size=mb), full, atol=1e-6)
    assert full.requires_grad is False and full.shape == (6, T)
    for budget in (1, 12, 20):                 # token budgets: one row each, then a few rows per micro-batch
        assert len(bucketed_micro_batches(mask, 0, budget)) > 1
        assert torch.allclose(fixed_logprobs(model, ids, mask, T, max_tokens=budget), full, atol=1e-6)


def test_lora_reference_through_the_chunked_path_is_the_base_model():
    base = tiny_qwen2(VOCAB)
    model = lora_qwen2()
    ids, mask = padded_batch()
    with model.disable_adapter():
        ref = fixed_logprobs(model, ids, mask, T)
    assert torch.allclose(ref, fixed_logprobs(base, ids, mask, T), atol=1e-6)
    assert not torch.allclose(ref, fixed_logprobs(model, ids, mask, T), atol=1e-3)   # adapters matter


def test_logit_softcap_falls_back_to_the_model_forward():
    model = tiny_qwen2(VOCAB)
    assert split_model(model) is not None
    capped = copy.deepcopy(model)
    capped.config.final_logit_softcapping = 30.0
    assert split_model(capped) is None
    ids, mask = padded_batch()
    a, _ = completion_logprobs(capped, ids, mask, T)
    assert torch.allclose(a, logits_path(capped, ids, mask, T, 1.0, False, False)[0])


def test_fixed_logprobs_entropy_honours_the_token_budget():
    """The entropy of the top-entropy token mask comes from fixed_logprobs' own pass: with a small token
    budget it equals the one-pass value and a direct float64 -sum p log p over the full logits."""
    model = tiny_qwen2(vocab_size=VOCAB)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (5, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0                                                           # a left-padded row
    T = 4
    logp, ent = fixed_logprobs(model, ids, mask, T, 0.7, with_entropy=True)
    logp_b, ent_b = fixed_logprobs(model, ids, mask, T, 0.7, max_tokens=12, with_entropy=True)
    assert len(bucketed_micro_batches(mask, 0, 12)) > 1                       # the budget really splits
    torch.testing.assert_close(ent_b, ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logp_b, logp, atol=1e-5, rtol=1e-5)
    assert torch.equal(fixed_logprobs(model, ids, mask, T, 0.7), logp)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.double() / 0.7
    p = torch.softmax(logits[:, -T - 1:-1], -1)                               # [N, T, V] predicting the completion
    direct = -(p * p.log()).sum(-1)
    torch.testing.assert_close(ent.double(), direct, atol=1e-4, rtol=1e-4)
