"""grpo/modeling/shared_prompt.py: each distinct prompt runs once, and log-probs and gradients stay those of
the plain forward."""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from grpo.modeling import shared_prompt
from grpo.modeling.logprobs import completion_logprobs, fixed_logprobs, split_model
from grpo.modeling.shared_prompt import distinct_prompts
from grpo.training.update import set_gradient_checkpointing
from tests.conftest import tiny_qwen2
from tests.modeling.test_logprobs import VOCAB, lora_qwen2, tiny_gpt2

P, T, G = 5, 6, 4


def group_batch(groups: int = 2, seed: int = 0):
    """`groups` left-padded prompts, G rows each, completions of varied length (right padding).

    Shape: ids, mask [groups * G, P + T]
    """
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = [5, 3, 4][:groups]
    ids = torch.randint(2, VOCAB, (groups * G, P + T), generator=g)
    mask = torch.ones_like(ids)
    for i, length in enumerate(prompt_lengths):
        rows = slice(i * G, (i + 1) * G)
        ids[rows, :P] = torch.randint(2, VOCAB, (P,), generator=g)          # the same prompt in all G rows
        ids[rows, :P - length], mask[rows, :P - length] = 0, 0              # left padding
    for row, length in enumerate(torch.randint(1, T + 1, (groups * G,), generator=g).tolist()):
        ids[row, P + length:], mask[row, P + length:] = 0, 0                # right padding after the completion
    return ids, mask


def backbone_calls(model) -> list[int]:
    """Count the backbone's forward calls (a forward hook on it)."""
    calls = []
    split_model(model)[0].register_forward_hook(lambda *a: calls.append(1))
    return calls


def logps_and_grads(model, ids, mask, share: bool, monkeypatch):
    """Log-probs, entropies and parameter gradients (eval mode: GPT-2's dropout would differ per call)."""
    monkeypatch.setattr(shared_prompt, "MIN_SAVING", 0.15 if share else 2.0)   # 2.0: never worth sharing
    model.zero_grad(set_to_none=True)
    logp, ent = completion_logprobs(model.eval(), ids, mask, T, temperature=0.7, with_entropy=True, entropy_grad=True)
    ((logp * mask[:, P:]).sum() + 0.3 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


def test_distinct_prompts_by_tokens_and_padding():
    ids = torch.tensor([[0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 5, 6], [7, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])   # row 3: token 0 is real
    first, inverse = distinct_prompts(ids, mask)
    assert len(first) == 3
    assert inverse[0] == inverse[2] and inverse[1] == inverse[4] and len({*inverse[[0, 1, 3]].tolist()}) == 3
    assert torch.equal(first[inverse[[0, 1, 2, 3, 4]]], torch.tensor([0, 1, 0, 3, 1]))   # each row's first copy


@pytest.mark.parametrize("make", [tiny_qwen2, tiny_gpt2, lora_qwen2], ids=["qwen2", "gpt2", "lora"])
def test_shared_prompt_forward_equals_plain_values_and_gradients(make, monkeypatch):
    model = make(VOCAB) if make is tiny_qwen2 else make()
    ids, mask = group_batch()
    calls = backbone_calls(model)
    shared = logps_and_grads(model, ids, mask, True, monkeypatch)
    assert len(calls) == 2                                   # the 2 distinct prompts, then the 8 completions
    plain = logps_and_grads(model, ids, mask, False, monkeypatch)
    assert len(calls) == 3                                   # one forward over the whole rows
    torch.testing.assert_close(shared[0], plain[0], atol=1e-6, rtol=1e-5)       # log-probs
    torch.testing.assert_close(shared[1], plain[1], atol=1e-6, rtol=1e-5)       # entropies
    assert shared[2].keys() == plain[2].keys() and len(shared[2]) > 0
    for name in plain[2]:
        torch.testing.assert_close(shared[2][name], plain[2][name], atol=1e-6, rtol=1e-4)
    assert (shared[0][mask[:, P:] == 0] == 0).all()


def test_shared_prompt_under_bf16_autocast_matches_plain_forward(monkeypatch):
    """train.precision bf16: the shared-prompt forward (a cached prompt pass then the completions) and the
    plain forward, both under autocast, give float32 log-probs equal within bfloat16 rounding and
    gradients that point the same way."""
    model = tiny_qwen2(VOCAB)
    ids, mask = group_batch()
    calls = backbone_calls(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shared = logps_and_grads(model, ids, mask, True, monkeypatch)
        plain = logps_and_grads(model, ids, mask, False, monkeypatch)
    assert len(calls) == 3                                   # 2 shared calls, then 1 plain one
    exact = logps_and_grads(model, ids, mask, False, monkeypatch)
    assert shared[0].dtype is torch.float32
    torch.testing.assert_close(shared[0], plain[0], atol=0.02, rtol=0)
    assert 0 < (shared[0] - exact[0]).abs().max() < 0.05                    # bf16 did run, and stays close
    flat = [torch.cat([g[n].flatten() for n in sorted(plain[2])]) for g in (shared[2], plain[2])]
    assert torch.nn.functional.cosine_similarity(*flat, dim=0) > 0.999


def test_reference_pass_shares_prompts_in_every_micro_batch(monkeypatch):
    model = tiny_qwen2(VOCAB)
    ids, mask = group_batch(groups=3)
    calls = backbone_calls(model)
    shared = fixed_logprobs(model, ids, mask, T, max_tokens=40)             # several length buckets
    n_calls = len(calls)
    monkeypatch.setattr(shared_prompt, "MIN_SAVING", 2.0)
    plain = fixed_logprobs(model, ids, mask, T, max_tokens=40)
    assert n_calls > len(calls) - n_calls                    # some buckets took two calls (prompts, completions)
    torch.testing.assert_close(shared, plain, atol=1e-6, rtol=1e-5)


def test_plain_forward_when_sharing_does_not_apply():
    model = tiny_qwen2(VOCAB)
    calls = backbone_calls(model)
    ids, mask = group_batch()
    distinct = ids.clone()
    distinct[:, P - 1] = torch.arange(2, 2 + len(ids))                     # every prompt different
    completion_logprobs(model, distinct, mask, T)
    assert len(calls) == 1
    set_gradient_checkpointing(model, True)                  # the layers would drop the cache
    completion_logprobs(model.train(), ids, mask, T)[0].sum().backward()
    assert len(calls) == 2
    set_gradient_checkpointing(model, False)
    completion_logprobs(model, ids, mask, T)
    assert len(calls) == 4                                   # shared again: two calls


def test_sliding_window_models_take_the_plain_forward():
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             sliding_window=4))
    assert not shared_prompt.plain_cache_model(split_model(model)[0])
    calls = backbone_calls(model)
    ids, mask = group_batch()
    completion_logprobs(model, ids, mask, T)
    assert len(calls) == 1


def test_group_sum_adds_the_rows_of_each_group():
    x = torch.tensor([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0], [1000.0, 2000.0]])
    inverse = torch.tensor([1, 0, 1, 1])
    # group 0: row 1 = [10, 20]; group 1: rows 0, 2, 3 = [1 + 100 + 1000, 2 + 200 + 2000]
    assert torch.equal(shared_prompt.group_sum(x, inverse, 2), torch.tensor([[10.0, 20.0], [1101.0, 2202.0]]))
    assert torch.equal(shared_prompt.group_sum(x, inverse, 3)[2], torch.zeros(2))       # an empty group is 0


def test_expand_rows_backward_is_deterministic_and_equals_index_select():
    """The cache expansion's backward (many rows into one prompt row) gives the same result at every
    call, on a shape where `keys[inverse]`'s backward (index_put_ with accumulate, run by several threads
    at once) varied from call to call at 2 threads, and equals index_select's gradient within rounding."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        U, G = 16, 8                                                         # 16 prompts x 8 rows: [128, 2, 20, 32]
        x = torch.randn(U, 2, 20, 32, generator=g, requires_grad=True)
        inverse = torch.arange(U).repeat_interleave(G)[torch.randperm(U * G, generator=g)]
        upstream = torch.randn(U * G, 2, 20, 32, generator=g)
        grads = []
        for _ in range(20):
            x.grad = None
            shared_prompt.expand_rows(x, inverse).backward(upstream)
            grads.append(x.grad.clone())
        assert all(torch.equal(grads[0], grad) for grad in grads[1:])
        x.grad = None
        x.index_select(0, inverse).backward(upstream)
        torch.testing.assert_close(grads[0], x.grad, atol=1e-5, rtol=1e-5)
        assert torch.equal(shared_prompt.expand_rows(x, inverse), x[inverse])   # the forward is a plain gather
    finally:
        torch.set_num_threads(previous)


def test_trailing_padding_needs_no_attention_mask(monkeypatch):
    """Rows of one prompt whose completions end at different lengths: the forward runs causal, with no
    [n, 1, L, L] mask (quadratic in the length), and the real tokens' log-probs are those of the masked forward."""
    from grpo.modeling.shared_prompt import causal_only_mask

    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]])
    assert causal_only_mask(mask).tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 1, 1, 1], [1, 1, 1, 1, 1]]

    model = tiny_qwen2(VOCAB).double()
    ids, mask = group_batch(groups=1)                  # prompt of 5 tokens (no left padding), right padding
    assert bool((mask == 0).any())
    monkeypatch.setattr(shared_prompt, "MIN_SAVING", 1.0)    # the plain path (long completions do not share)
    masks, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: masks.append(k.get("attn_mask")) or sdpa(*a, **k))
    logp, _ = completion_logprobs(model, ids, mask, T)
    assert masks and all(m is None for m in masks)     # is_causal everywhere
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    expected = torch.log_softmax(out[:, P - 1:-1].double(), -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    real = mask[:, P:].bool()
    torch.testing.assert_close(logp[real], expected[real], rtol=1e-10, atol=1e-10)
