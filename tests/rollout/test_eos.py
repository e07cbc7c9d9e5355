"""grpo/rollout/eos.py: every EOS id (tokenizer + generation_config) ends a completion, in the sampler's lean
and Hugging Face paths and in multi-turn episodes; completion text skips special tokens as TRL's does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tokenizers import AddedToken
from transformers import GenerationConfig

from grpo.modeling.models import build_tokenizer
from grpo.rollout import completion_mask_from_ids, completion_text, eos_token_ids, sample
from grpo.rollout.eos import as_id_list, ended_with_eos
from grpo.rollout.multiturn import sample_episodes
from grpo.rollout.params import Prompts, SamplingParams
from tests.conftest import tiny_qwen2

PAD, EOS = 0, 1          # tiny_qwen2's pad and eos ids


def tokenizer_with(eos: int | None):
    return SimpleNamespace(eos_token_id=eos)


def model_with(eos):
    return SimpleNamespace(generation_config=GenerationConfig(eos_token_id=eos))


@pytest.mark.parametrize("tok_eos, listed, expected", [
    (1, None, (1,)),                       # no generation config ids: the tokenizer's only
    (1, 1, (1,)),                          # the same id once
    (1, 7, (1, 7)),                        # an int
    (1, [7, 1, 9, 7], (1, 7, 9)),          # a list (Llama-3-Instruct style): deduplicated, order kept
    (None, [7, 9], (7, 9)),                # a tokenizer without eos
])
def test_eos_token_ids_joins_the_tokenizer_and_the_generation_config(tok_eos, listed, expected):
    assert eos_token_ids(tokenizer_with(tok_eos), model_with(listed)) == expected


def test_eos_token_ids_without_a_model_or_through_a_wrapper():
    assert eos_token_ids(tokenizer_with(1)) == (1,)
    ddp = SimpleNamespace(module=model_with([5, 6]))           # DDP keeps the model under .module
    assert eos_token_ids(tokenizer_with(1), ddp) == (1, 5, 6)
    assert as_id_list(3) == [3] and as_id_list((3, 4)) == [3, 4] and as_id_list(torch.tensor([3, 4])) == [3, 4]


def test_mask_and_truncation_end_at_the_first_of_any_eos_id():
    ids = torch.tensor([[5, 7, 9, 9],      # 7 (a generation-config eos) at 1: kept, the rest masked
                        [9, 9, 1, 7],      # the tokenizer's eos at 2 comes first
                        [5, 5, 5, 5]])     # no eos: cut by the cap
    mask = completion_mask_from_ids(ids, (1, 7))
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert ended_with_eos(ids, mask, (1, 7)).tolist() == [True, True, False]
    assert completion_mask_from_ids(ids, 9).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]  # one id as before


def first_fresh_token(model, ids, mask, lean, step=2):
    """Row 0's greedy token at `step` or later that it has not emitted before (so it ends row 0 right there)."""
    gen = sample(model, Prompts(ids, mask),
                 SamplingParams(n=1, max_tokens=step + 6, temperature=0, stop_token_ids=(-1,)),
                 pad_token_id=PAD, lean=lean)
    row = gen.completion_ids[0].tolist()
    pos = next(t for t in range(step, len(row)) if row[t] not in row[:t] and row[t] != EOS)
    return row[pos], pos


@pytest.mark.parametrize("lean", [True, False])
def test_sampling_stops_at_an_eos_id_listed_only_in_the_generation_config(lean):
    """A model whose generation_config lists an extra eos id: row 0 stops there, its mask ends there (the id
    kept), it is not truncated; the tokens equal Hugging Face generate's with the same eos list."""
    model = tiny_qwen2()
    ids = torch.tensor([[3, 4, 5, 6], [PAD, PAD, 8, 9]])
    mask = (ids != PAD).long()
    extra, pos = first_fresh_token(model, ids, mask, lean)
    model.generation_config = GenerationConfig(eos_token_id=[EOS, extra], pad_token_id=PAD)
    eos = eos_token_ids(tokenizer_with(EOS), model)
    assert eos == (EOS, extra)
    gen = sample(model, Prompts(ids, mask),
                 SamplingParams(n=2, max_tokens=10, temperature=0, stop_token_ids=eos),
                 pad_token_id=PAD, lean=lean)
    for r in (0, 1):                                            # greedy: both samples of prompt 0 are alike
        assert gen.completion_ids[r, pos].item() == extra
        assert gen.completion_mask[r].tolist()[:pos + 2] == [1] * (pos + 1) + [0]
        assert not gen.truncated[r]
    hf = model.generate(input_ids=ids.repeat_interleave(2, 0), attention_mask=mask.repeat_interleave(2, 0),
                        do_sample=False, max_new_tokens=10, eos_token_id=[EOS, extra], pad_token_id=PAD)
    hf = hf[:, ids.size(1):]
    assert torch.equal(gen.completion_ids, hf[:, :gen.completion_ids.size(1)])
    only_tokenizer = sample(model, Prompts(ids, mask),
                            SamplingParams(n=2, max_tokens=10, temperature=0, stop_token_ids=(EOS,)),
                            pad_token_id=PAD, lean=lean)
    assert int(only_tokenizer.completion_mask[0].sum()) > pos + 1   # the old behaviour ran past it


class Never:
    """A driver that never answers: episodes end at an EOS or the token cap."""

    def __init__(self):
        self.finished = {}

    def after_token(self, row, token):
        return [], False

    def finish(self, row, ended_by_eos):
        self.finished[row] = ended_by_eos


def test_an_episode_ends_at_any_eos_id():
    model = tiny_qwen2()
    ids, mask = torch.tensor([[3, 4, 5, 6]]), torch.ones(1, 4, dtype=torch.long)
    params = SamplingParams(n=1, max_tokens=10, temperature=0)
    probe = sample_episodes(model, Prompts(ids, mask), params.with_(stop_token_ids=(-1,)), Never(),
                            pad_token_id=PAD).completion_ids[0].tolist()
    pos = next(t for t in range(2, len(probe)) if probe[t] not in probe[:t] and probe[t] != EOS)
    driver = Never()
    gen = sample_episodes(model, Prompts(ids, mask), params.with_(stop_token_ids=(EOS, probe[pos])), driver,
                          pad_token_id=PAD)
    assert gen.completion_ids[0].tolist() == probe[:pos + 1] and gen.completion_mask[0].tolist() == [1] * (pos + 1)
    assert driver.finished == {0: True} and not gen.truncated[0]


def special_tokenizer():
    """The embedded character tokenizer plus special <tool_call>, </tool_call> and <|im_end|> tokens."""
    tok = build_tokenizer()
    tags = ("<tool_call>", "</tool_call>", "<|im_end|>")
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in tags], special_tokens=True)
    return tok


def test_completion_text_skips_special_tokens_as_trl_does():
    tok = build_tokenizer()
    ids = tok("42", add_special_tokens=False)["input_ids"] + [tok.unk_token_id] + tok("7", add_special_tokens=False)[
        "input_ids"] + [tok.eos_token_id]
    assert completion_text(tok, ids) == "427"                   # TRL: batch_decode(..., skip_special_tokens=True)
    tags = tok("<think>a</think><answer>1</answer>", add_special_tokens=False)["input_ids"]
    assert len(tags) == 6 and completion_text(tok, tags) == "<think>a</think><answer>1</answer>"  # not special
    stok = special_tokenizer()
    ids = stok("a<tool_call>c(1)</tool_call>b<|im_end|>", add_special_tokens=False)["input_ids"]
    assert completion_text(stok, ids) == "ac(1)b"
    keep = set(stok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]))
    assert completion_text(stok, ids, keep=keep) == "a<tool_call>c(1)</tool_call>b"
