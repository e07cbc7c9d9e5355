"""Token choice (grpo/rollout/choice.py): min-p and the repetition penalty, against float64 formulas and
Hugging Face's generate; the sampler honours both."""

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper

from grpo.rollout import sample
from grpo.rollout.choice import filter_logits, mark_seen, penalize_repeats
from grpo.rollout.params import Prompts, SamplingParams
from tests.rollout.test_rollout import PAD, VOCAB, full_logits, make_model, make_prompts


@pytest.mark.parametrize("min_p, temperature", [(0.05, 1.0), (0.3, 0.7), (0.9, 1.5)])
def test_min_p_keeps_tokens_within_a_fraction_of_the_most_likely(min_p, temperature):
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3
    kept = torch.isfinite(filter_logits(logits, temperature, min_p=min_p))
    p = torch.softmax(logits.double() / temperature, dim=-1)                        # float64 formula
    assert torch.equal(kept, p >= min_p * p.amax(dim=-1, keepdim=True))
    hf = MinPLogitsWarper(min_p=min_p)(None, logits / temperature)                 # Hugging Face's warper
    assert torch.equal(kept, torch.isfinite(hf))


def test_min_p_applies_after_top_k():
    logits = torch.tensor([[4.0, 3.0, 1.0, 0.0]])
    # top-2 leaves p = [0.731, 0.269]; min_p 0.5 keeps tokens >= 0.366: token 0 only
    assert torch.isfinite(filter_logits(logits, 1.0, top_k=2, min_p=0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(filter_logits(logits, 1.0, min_p=0.3)).tolist() == [[True, True, False, False]]


def test_repetition_penalty_hand_example():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = torch.tensor([[True, True, False, False]])
    assert penalize_repeats(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, 3.0]]
    assert penalize_repeats(logits, seen, 0.5).tolist() == [[4.0, -0.5, 0.5, 3.0]]    # < 1 encourages repeats


def test_mark_seen_skips_masked_positions():
    seen = torch.zeros(2, 6, dtype=torch.bool)
    mark_seen(seen, torch.tensor([[0, 3, 3], [5, 1, 2]]), torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert seen.nonzero().tolist() == [[0, 3], [1, 1], [1, 5]]
    mark_seen(seen, torch.tensor([4, 4]))
    assert seen.sum().item() == 5


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
@pytest.mark.parametrize("penalty", [1.5, 0.7])
def test_greedy_with_repetition_penalty_matches_generate(kind, penalty):
    """Each prompt alone (Hugging Face counts left padding as seen tokens; we do not), and the padded batch
    gives each row the completion it has alone."""
    model = make_model(kind)
    ids, mask = make_prompts()
    batched = sample(model, Prompts(ids, mask), SamplingParams(n=2, max_tokens=10, temperature=0, stop_token_ids=(VOCAB + 1,),
                                                               repetition_penalty=penalty),
                     pad_token_id=PAD)
    plain = sample(model, Prompts(ids, mask),
                   SamplingParams(n=1, max_tokens=10, temperature=0, stop_token_ids=(VOCAB + 1,)), pad_token_id=PAD)
    assert not torch.equal(batched.completion_ids[::2], plain.completion_ids)     # the penalty changes something
    for i in range(ids.size(0)):
        real = ids[i, mask[i].bool()][None]
        ref = model.generate(input_ids=real, attention_mask=torch.ones_like(real), do_sample=False, max_new_tokens=10,
                             repetition_penalty=penalty, eos_token_id=VOCAB + 1, pad_token_id=PAD)[:, real.size(1):]
        assert torch.equal(batched.completion_ids[2 * i:2 * i + 2], ref.repeat(2, 1)), i


def test_sampled_tokens_respect_min_p():
    model = make_model("llama")
    ids, mask = make_prompts()
    gen = sample(model, Prompts(ids, mask),
                 SamplingParams(n=4, max_tokens=8, temperature=1.0, min_p=0.3, stop_token_ids=(VOCAB + 1,), seed=3),
                 pad_token_id=PAD)
    full_ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
    full_mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
    p = torch.softmax(full_logits(model, full_ids, full_mask)[:, ids.size(1) - 1:-1].double(), -1)   # [N, T, V]
    chosen = p.gather(-1, gen.completion_ids[..., None]).squeeze(-1)
    assert (chosen >= 0.3 * p.amax(-1) - 1e-6).all()
    unfiltered = sample(model, Prompts(ids, mask),
                        SamplingParams(n=4, max_tokens=8, temperature=1.0, stop_token_ids=(VOCAB + 1,), seed=3),
                        pad_token_id=PAD)
    assert not torch.equal(unfiltered.completion_ids, gen.completion_ids)
