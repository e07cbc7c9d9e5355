"""Tests for grpo.rollout: sampler against HF generate and a cache-free reference."""

import math

import pytest
import torch
import torch.nn.functional as F
import transformers

from grpo.rollout import Generation, completion_mask_from_ids, filter_logits, sample
from grpo.rollout.keyed import row_keys, token_uniforms
from grpo.rollout.params import Prompts, SamplingParams
from grpo.rollout.sampler import draw

VOCAB = 64
PAD = 0


def make_model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=128)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=128)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=PAD,
                                      tie_word_embeddings=False)  # tied + random => greedy repeats the input
        model = transformers.GPT2LMHeadModel(cfg)
    # Sharpen the random model a little so completions are not uniform noise.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()


def make_prompts():
    """Three left-padded prompts of lengths 5, 2, 4."""
    ids = torch.tensor([[11, 12, 13, 14, 15], [PAD, PAD, PAD, 21, 22], [PAD, 31, 32, 33, 34]])
    mask = (torch.arange(5)[None, :] >= torch.tensor([0, 3, 1])[:, None]).long()
    return ids, mask


def full_logits(model, ids, mask):
    """Logits of a cache-free full forward. [n, L] -> [n, L, V]"""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.float()


@torch.no_grad()
def reference_sample(model, prompts: Prompts, params: SamplingParams, pad_token_id: int):
    """No cache, no shared prefix: prompts repeated G times, full forward each step; the still-running
    rows draw with the uniforms of their keys (seed, prompt index, g, step), as documented by the sampler."""
    G, (eos_token_id,) = params.n, params.stop_token_ids
    index = torch.arange(prompts.ids.size(0)) if prompts.index is None else prompts.index
    keys = row_keys(params.seed, index, G)                                      # [N]
    ids = prompts.ids.repeat_interleave(G, 0)
    mask = prompts.mask.repeat_interleave(G, 0)
    n = ids.size(0)
    out = torch.full((n, params.max_tokens), pad_token_id)
    running = torch.ones(n, dtype=torch.bool)
    steps = 0
    for t in range(params.max_tokens):
        logits = full_logits(model, ids, mask)[:, -1]
        probs = F.softmax(filter_logits(logits[running], params.temperature, params.top_k, params.top_p), -1)
        tok = torch.full((n,), pad_token_id)
        tok[running] = draw(probs, token_uniforms(keys, t)[running])
        out[:, t] = tok
        steps = t + 1
        running = running & (tok != eos_token_id)
        if not running.any():
            break
        ids = torch.cat([ids, tok[:, None]], 1)
        mask = torch.cat([mask, torch.ones(n, 1, dtype=torch.long)], 1)
    return out[:, :steps]


def pick_eos(model, ids, mask, step=2):
    """A token greedy decoding first emits in row 0 at position `step` (or the first later position
    with a fresh token), so EOS handling is exercised mid-sequence. Returns (token, position)."""
    gen = sample(model, Prompts(ids, mask), SamplingParams(n=1, max_tokens=step + 6, temperature=0,
                                                           stop_token_ids=(VOCAB + 1,)), pad_token_id=PAD)
    row = gen.completion_ids[0].tolist()
    pos = next(t for t in range(step, len(row)) if row[t] not in row[:t])
    return row[pos], pos


def sampled_eos(model, prompts: Prompts, params: SamplingParams, position: int) -> SamplingParams:
    """`params` with the token row 0 draws at `position` with no EOS as its stop token: row 0 stops there."""
    probe = sample(model, prompts, params.with_(stop_token_ids=(VOCAB + 1,)), pad_token_id=PAD)
    return params.with_(stop_token_ids=(int(probe.completion_ids[0, position]),))


# 1. greedy == HF generate ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["qwen2", "llama", "gpt2"])
@pytest.mark.parametrize("G", [1, 3])
def test_greedy_matches_generate(kind, G):
    model = make_model(kind)
    ids, mask = make_prompts()
    eos, pos = pick_eos(model, ids, mask)
    gen = sample(model, Prompts(ids, mask), SamplingParams(n=G, max_tokens=10, temperature=0, stop_token_ids=(eos,)),
                 pad_token_id=PAD)
    ref = model.generate(input_ids=ids.repeat_interleave(G, 0), attention_mask=mask.repeat_interleave(G, 0),
                         do_sample=False, max_new_tokens=10, eos_token_id=eos, pad_token_id=PAD)
    ref = ref[:, ids.size(1):]
    assert torch.equal(gen.completion_ids, ref)
    assert gen.completion_mask[0, :pos + 2].tolist() == [1] * (pos + 1) + [0]  # row 0 stops at the picked EOS
    assert torch.equal(gen.prompt_ids, ids.repeat_interleave(G, 0))
    assert torch.equal(gen.prompt_mask, mask.repeat_interleave(G, 0))


def test_left_padding_does_not_change_greedy_completion():
    model = make_model("qwen2")
    ids, mask = make_prompts()
    params = SamplingParams(n=1, max_tokens=6, temperature=0, stop_token_ids=(VOCAB + 1,))
    batched = sample(model, Prompts(ids, mask), params, pad_token_id=PAD)
    for i in range(ids.size(0)):
        real = ids[i, mask[i].bool()][None]
        alone = sample(model, Prompts(real, torch.ones_like(real)), params, pad_token_id=PAD)
        assert torch.equal(alone.completion_ids[0], batched.completion_ids[i])


@pytest.mark.parametrize("lean", [True, False])
def test_prompts_are_prefilled_once_not_per_generation(lean):
    model = make_model("qwen2")
    ids, mask = make_prompts()
    seen = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        sample(model, Prompts(ids, mask), SamplingParams(n=4, max_tokens=3, stop_token_ids=(VOCAB + 1,), seed=0),
               pad_token_id=PAD, lean=lean)
    finally:
        hook.remove()
    # the lean decoder (grpo/modeling/decoder.py) runs decode steps without the model's forward
    assert seen == [(3, 5)] + ([] if lean else [(12, 1), (12, 1)])


# 2. prefix-shared cached sampling == cache-free reference -----------------------------------------

@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 8, 0.9)])
def test_sampling_matches_cache_free_reference(temperature, top_k, top_p):
    model = make_model("llama")
    ids, mask = make_prompts()
    prompts = Prompts(ids, mask)
    params = SamplingParams(n=4, max_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p, seed=1234)
    params = sampled_eos(model, prompts, params, 2)  # row 0 (at least) stops early
    gen = sample(model, prompts, params, pad_token_id=PAD)
    ref = reference_sample(model, prompts, params, PAD)
    assert torch.equal(gen.completion_ids, ref)
    assert gen.completion_ids.shape[0] == 12
    assert (gen.completion_mask == 0).any()  # some rows stopped early: exercises dropping finished rows


def test_sampling_across_blocks_of_uniforms_matches_the_reference():
    from grpo.rollout.sampler import UNIFORM_BLOCK

    model = make_model("llama")
    ids, mask = make_prompts()
    prompts = Prompts(ids, mask, torch.tensor([4, 0, 9]))
    params = SamplingParams(n=2, max_tokens=UNIFORM_BLOCK + 6, temperature=1.0, top_k=0, top_p=1.0, seed=21)
    params = sampled_eos(model, prompts, params, UNIFORM_BLOCK + 2)   # row 0 stops in block 2
    gen = sample(model, prompts, params, pad_token_id=PAD)
    ref = reference_sample(model, prompts, params, PAD)
    assert torch.equal(gen.completion_ids, ref)
    lengths = gen.completion_mask.sum(1)                                         # [6]
    assert lengths[0] <= UNIFORM_BLOCK + 3 and (lengths > UNIFORM_BLOCK).any() and (lengths < lengths.max()).any()


# 3. sampling_logprobs == log-softmax of filtered logits of a full forward -------------------------

@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 6, 0.85), (0.0, 0, 1.0)])
def test_sampling_logprobs_match_full_forward(kind, temperature, top_k, top_p):
    model = make_model(kind)
    ids, mask = make_prompts()
    params = SamplingParams(n=3, max_tokens=8, temperature=temperature, top_k=top_k, top_p=top_p, seed=7)
    gen = sample(model, Prompts(ids, mask), sampled_eos(model, Prompts(ids, mask), params, 1), pad_token_id=PAD)
    P, T = gen.prompt_ids.size(1), gen.completion_ids.size(1)
    logits = full_logits(model, torch.cat([gen.prompt_ids, gen.completion_ids], 1),
                         torch.cat([gen.prompt_mask, gen.completion_mask], 1))[:, P - 1:P - 1 + T]
    if temperature > 0:
        logits = filter_logits(logits, temperature, top_k, top_p)
    expected = F.log_softmax(logits, -1).gather(-1, gen.completion_ids[..., None]).squeeze(-1)
    on = gen.completion_mask.bool()
    assert gen.sampling_logprobs.dtype == torch.float32
    assert torch.allclose(gen.sampling_logprobs[on], expected[on], atol=1e-5)
    assert (gen.sampling_logprobs[~on] == 0).all()
    assert (~on).any()  # some row finished early, so the masked-out branch was exercised


# 4. EOS handling ------------------------------------------------------------------------------------

def with_eos_bias(model, eos, bias):
    """Replace the LM head by one with a bias of `bias` on the EOS logit."""
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[eos] = bias
    model.lm_head = head
    return model


@pytest.mark.parametrize("pad", [PAD, 5])  # pad == EOS is a common tokenizer setup
def test_forced_eos_stops_immediately(pad):
    eos = 5
    model = with_eos_bias(make_model("qwen2"), eos, 100.0)
    ids, mask = make_prompts()
    gen = sample(model, Prompts(ids, mask), SamplingParams(n=2, max_tokens=8, stop_token_ids=(eos,), seed=0),
                 pad_token_id=pad)
    assert gen.completion_ids.tolist() == [[eos]] * 6
    assert gen.completion_mask.tolist() == [[1]] * 6
    assert not gen.truncated.any()
    assert torch.allclose(gen.sampling_logprobs, torch.zeros(6, 1), atol=1e-6)


def test_eos_mid_sequence_masks_and_pads_after():
    model = make_model("qwen2")
    ids, mask = make_prompts()
    eos, pos = pick_eos(model, ids, mask, step=2)
    gen = sample(model, Prompts(ids, mask), SamplingParams(n=2, max_tokens=9, temperature=0, stop_token_ids=(eos,)),
                 pad_token_id=PAD)
    assert gen.completion_ids[0, pos] == eos
    assert gen.completion_mask[0].tolist() == [1] * (pos + 1) + [0] * (gen.completion_ids.size(1) - pos - 1)
    for row, m, trunc in zip(gen.completion_ids, gen.completion_mask, gen.truncated):
        hits = (row == eos).nonzero().flatten().tolist()
        if hits:  # ends at and includes the first EOS, pad after
            L = hits[0] + 1
            assert m.tolist() == [1] * L + [0] * (len(row) - L)
            assert (row[L:] == PAD).all() and not trunc
        else:
            assert m.all() and trunc and len(row) == 9
    assert not gen.truncated[0]


def test_max_new_tokens_truncates():
    eos = 5
    model = with_eos_bias(make_model("qwen2"), eos, -100.0)
    ids, mask = make_prompts()
    gen = sample(model, Prompts(ids, mask), SamplingParams(n=2, max_tokens=7, stop_token_ids=(eos,), seed=0),
                 pad_token_id=PAD)
    assert gen.completion_ids.shape == (6, 7)
    assert (gen.completion_mask == 1).all()
    assert gen.truncated.all()
    assert (gen.completion_ids != eos).all()
    assert (gen.sampling_logprobs < 0).all()


def test_completion_mask_from_ids():
    ids = torch.tensor([[3, 4, 9, 0], [9, 9, 9, 9], [1, 2, 3, 4]])
    assert completion_mask_from_ids(ids, 9).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


# 5. filter_logits ------------------------------------------------------------------------------------

def test_filter_top_p_hand_example():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    keep = lambda p: torch.isfinite(filter_logits(logits, 1.0, 0, p)).tolist()  # noqa: E731
    assert keep(0.7) == [True, True, False, False]      # 0.5 < 0.7 <= 0.8
    assert keep(0.5) == [True, False, False, False]     # the first token alone reaches 0.5
    assert keep(0.81) == [True, True, True, False]
    assert keep(0.99) == [True, True, True, True]
    assert keep(0.0) == [True, False, False, False]     # always at least one token
    # survivors keep their relative probabilities: renormalised [0.5, 0.3] -> [0.625, 0.375]
    probs = filter_logits(logits, 1.0, 0, 0.7).softmax(-1)
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_filter_top_k_and_temperature():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0], [0.0, -1.0, 5.0, 1.0]])
    out = filter_logits(logits, 2.0, 2, 1.0)
    inf = float("-inf")
    assert out.tolist() == [[inf, 2.0, inf, 1.5], [inf, inf, 2.5, 0.5]]
    assert torch.equal(filter_logits(logits, 1.0, 0, 1.0), logits)   # disabled filters
    assert torch.equal(filter_logits(logits, 1.0, 10, 1.0), logits)  # k > V keeps everything


def test_filter_temperature_then_top_p():
    # temperature 0.5 turns probs ∝ [4, 2, 1, 1] into ∝ [16, 4, 1, 1]: the first holds 16/22 ≈ 0.727
    logits = torch.tensor([4.0, 2.0, 1.0, 1.0]).log()
    assert torch.isfinite(filter_logits(logits, 1.0, 0, 0.7)).tolist() == [True, True, False, False]
    assert torch.isfinite(filter_logits(logits, 0.5, 0, 0.7)).tolist() == [True, False, False, False]
    assert math.isclose(filter_logits(logits, 0.5, 0, 1.0).softmax(-1)[0].item(), 16 / 22, rel_tol=1e-6)


# 6. reproducibility, 7. training flag ------------------------------------------------------------

def test_seeded_sampling_is_reproducible():
    model = make_model("gpt2")
    ids, mask = make_prompts()
    params = SamplingParams(n=3, max_tokens=8, top_k=10, stop_token_ids=(3,), seed=3)
    a = sample(model, Prompts(ids, mask), params, pad_token_id=PAD)
    b = sample(model, Prompts(ids, mask), params, pad_token_id=PAD)
    c = sample(model, Prompts(ids, mask), params.with_(seed=4), pad_token_id=PAD)
    for field in Generation.__dataclass_fields__:
        x, y = getattr(a, field), getattr(b, field)
        if field == "model_inputs":                                         # a text model: no extra inputs
            assert x == {} and y == {}
            continue
        assert (x is None and y is None) if field == "action_mask" else torch.equal(x, y)   # single-turn: no actions
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # the G samples of one prompt differ from each other
    assert not torch.equal(a.completion_ids[0], a.completion_ids[1])


@pytest.mark.parametrize("training", [True, False])
def test_training_flag_restored(training):
    model = make_model("qwen2")
    model.train(training)
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(m.training))
    ids, mask = make_prompts()
    sample(model, Prompts(ids, mask), SamplingParams(n=2, max_tokens=3, stop_token_ids=(3,)), pad_token_id=PAD)
    assert seen and not any(seen)  # sampled in eval mode
    assert model.training is training
    assert all(m.training is training for m in model.modules())


# inverse-CDF draw --------------------------------------------------------------------------------

def test_draw_follows_the_distribution_and_never_picks_zero_probability():
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3], [2.0, 0.0, 0.0, 0.0, 2.0]])   # row 1 unnormalised
    n = 40_000
    u = token_uniforms(row_keys(0, torch.arange(n), 2), 0)                     # [2n] row i*2+r: draw i of row r
    tok = draw(probs.repeat(n, 1), u).view(n, 2)                               # [n, 2]
    counts = torch.stack([torch.bincount(tok[:, r], minlength=5) for r in range(2)]).float()
    assert counts[0, 0] == counts[0, 2] == 0 and counts[1, 1:4].sum() == 0
    expected = probs / probs.sum(-1, keepdim=True)
    # binomial standard error at n = 40k is <= 0.0025: 4 sigma
    assert torch.allclose(counts / n, expected, atol=0.01)


def test_draw_is_the_inverse_cdf_of_one_uniform_per_row():
    probs = torch.rand(4, 7, generator=torch.Generator().manual_seed(3))
    u = torch.tensor([0.0, 0.3, 0.7, 1 - 2 ** -53], dtype=torch.float64)
    tok = draw(probs, u)
    cdf = probs.double().cumsum(-1)
    expected = [(cdf[i] > u[i] * cdf[i, -1]).nonzero()[0].item() for i in range(4)]   # first v with C_v > u C_V
    assert tok.tolist() == expected
    assert tok[0] == 0 and tok[3] == 6                  # u = 0 takes the first token, u -> 1 the last


# keyed sampling: a prompt's completions do not depend on the batch, the rank or the world size ----------

def test_a_batch_of_four_prompts_equals_two_batches_of_two_with_their_global_indices():
    model = make_model("llama")
    ids = torch.tensor([[11, 12, 13, 14, 15], [PAD, PAD, PAD, 21, 22], [PAD, 31, 32, 33, 34],
                        [PAD, PAD, 41, 42, 43]])
    mask = (ids != PAD).long()
    params = SamplingParams(n=3, max_tokens=10, temperature=1.0, top_k=0, top_p=1.0, seed=11)
    params = sampled_eos(model, Prompts(ids, mask), params, 2)           # rows finish at different steps
    index = torch.tensor([40, 41, 42, 43])                               # global positions of the 4 prompts
    whole = sample(model, Prompts(ids, mask, index), params, pad_token_id=PAD)
    parts = []
    for rows in ([0, 1], [2, 3]):                                        # "rank 0" and "rank 1"
        sub_ids, sub_mask = ids[rows], mask[rows]
        keep = sub_mask.any(0)                                           # each part left-padded to its own length
        parts.append(sample(model, Prompts(sub_ids[:, keep], sub_mask[:, keep], index[rows]), params,
                            pad_token_id=PAD))
    T = whole.completion_ids.size(1)
    split = torch.cat([torch.nn.functional.pad(p.completion_ids, (0, T - p.completion_ids.size(1)), value=PAD)
                       for p in parts])
    assert torch.equal(split, whole.completion_ids)
    assert (whole.completion_mask == 0).any() and whole.completion_mask.all(1).any()  # early and late finishers
    # the same prompts under other global indices sample other completions
    shifted = sample(model, Prompts(ids, mask, index + 4), params, pad_token_id=PAD)
    assert not torch.equal(shifted.completion_ids, whole.completion_ids)


def test_a_prompt_samples_the_same_completions_alone_or_in_a_batch_and_in_any_position():
    model = make_model("qwen2")
    ids, mask = make_prompts()
    params = SamplingParams(n=2, max_tokens=8, top_k=10, stop_token_ids=(3,), seed=5)
    batched = sample(model, Prompts(ids, mask, torch.tensor([7, 8, 9])), params, pad_token_id=PAD)
    reversed_ = sample(model, Prompts(ids.flip(0), mask.flip(0), torch.tensor([9, 8, 7])), params, pad_token_id=PAD)
    for i in range(3):
        real = ids[i, mask[i].bool()][None]
        alone = sample(model, Prompts(real, torch.ones_like(real), torch.tensor([7 + i])), params, pad_token_id=PAD)
        rows = slice(2 * i, 2 * i + 2)
        T = alone.completion_ids.size(1)
        assert torch.equal(alone.completion_ids, batched.completion_ids[rows, :T])
        assert (batched.completion_ids[rows, T:] == PAD).all()
        back = slice(2 * (2 - i), 2 * (2 - i) + 2)
        assert torch.equal(reversed_.completion_ids[back, :T], alone.completion_ids)


def test_greedy_ignores_the_keys():
    model = make_model("gpt2")
    ids, mask = make_prompts()
    params = SamplingParams(n=2, max_tokens=6, temperature=0, stop_token_ids=(VOCAB + 1,))
    a = sample(model, Prompts(ids, mask), params.with_(seed=1), pad_token_id=PAD)
    b = sample(model, Prompts(ids, mask, torch.tensor([5, 9, 100])), params.with_(seed=2), pad_token_id=PAD)
    assert torch.equal(a.completion_ids, b.completion_ids)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 0.9)])
def test_scratch_buffers_give_the_same_tokens_and_logprobs(temperature, top_k, top_p):
    """choose_tokens with a Scratch (buffers reused across steps, viewed at fewer rows as rows finish) picks the
    same tokens with bit-identical log-probs as without, and reuses its memory."""
    from grpo.rollout.sampler import Scratch, choose_tokens

    g = torch.Generator().manual_seed(0)
    scratch = Scratch()
    for n in (6, 6, 4, 1):
        logits, u = torch.randn(n, 300, generator=g) * 3, torch.rand(n, generator=g, dtype=torch.float64)
        want = choose_tokens(logits, temperature, top_k, top_p, u)
        got = choose_tokens(logits, temperature, top_k, top_p, u, scratch)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        if n == 6:
            ptr = scratch.buffers["cdf"].data_ptr()
    assert scratch.buffers["cdf"].data_ptr() == ptr and scratch.buffers["cdf"].dtype == torch.float64
