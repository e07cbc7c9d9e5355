import pytest
import torch

from grpo.modeling.logprobs import fixed_logprobs
from grpo.modeling.reference import AdapterDisabled, FrozenCopy, build_reference, mix_parameters
from tests.conftest import tiny_qwen2


def test_no_reference_when_beta_is_zero():
    assert build_reference(tiny_qwen2(), 0.0) is None


def test_frozen_copy_is_independent_of_the_policy():
    policy = tiny_qwen2()
    ref = build_reference(policy, 0.04)
    assert isinstance(ref, FrozenCopy) and ref.model is not policy
    assert all(not p.requires_grad for p in ref.model.parameters())
    ids = torch.randint(2, 32, (3, 7))
    mask = torch.ones_like(ids)
    before = ref.logprobs(ids, mask, 4, 1.0)
    assert torch.equal(before, fixed_logprobs(policy, ids, mask, 4, 1.0))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)
    assert torch.equal(ref.logprobs(ids, mask, 4, 1.0), before)     # the policy moved, pi_ref did not


def test_mix_parameters_matches_the_formula_in_float64():
    ref, policy = tiny_qwen2(seed=0).double(), tiny_qwen2(seed=1).double()
    expected = {n: 0.3 * pp + 0.7 * pr for (n, pr), (_, pp) in zip(ref.named_parameters(), policy.named_parameters())}
    mix_parameters(ref, policy, 0.3)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(p, expected[name], rtol=0, atol=1e-12)


def test_refresh_with_alpha_one_copies_the_policy():
    policy = tiny_qwen2(seed=0)
    ref = FrozenCopy(tiny_qwen2(seed=5))
    ref.refresh(policy, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(ref.model.parameters(), policy.parameters()))


def test_mix_rejects_different_architectures():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    other = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64))
    with pytest.raises(ValueError, match="different parameters"):
        mix_parameters(other, tiny_qwen2(), 0.5)


def test_adapter_reference_cannot_be_refreshed():
    with pytest.raises(ValueError, match="ref_update_steps"):
        AdapterDisabled(tiny_qwen2()).refresh(tiny_qwen2(), 1.0)


@pytest.mark.parametrize("mode", ["disk", "cpu"])
def test_offloaded_reference_equals_the_frozen_copy_bit_for_bit(mode):
    policy = tiny_qwen2(seed=2)
    plain, off = build_reference(policy, 0.04), build_reference(policy, 0.04, offload=mode)
    assert plain.offloaded is None and off.offloaded.nbytes == sum(p.numel() * 4 for p in policy.parameters())
    assert all(p.numel() == 0 for p in off.model.parameters())              # not resident between passes
    ids = torch.randint(2, 32, (4, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0                                                          # a left-padded row
    expected = plain.logprobs(ids, mask, 5, 0.7, micro_batch_size=2)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)                                                      # the policy moves, pi_ref does not
    assert torch.equal(off.logprobs(ids, mask, 5, 0.7, micro_batch_size=2), expected)
    assert all(p.numel() == 0 for p in off.model.parameters())
    with pytest.raises(ValueError, match="train.ref_offload none"):
        off.refresh(policy, 1.0)


def test_offloaded_reference_with_bf16_storage_equals_the_stored_copy():
    from grpo.modeling.precision import autocast

    policy = tiny_qwen2(seed=4)
    plain = build_reference(policy, 0.04, torch.bfloat16)
    off = build_reference(policy, 0.04, torch.bfloat16, offload="disk")
    assert off.offloaded.nbytes < sum(p.numel() * 4 for p in policy.parameters())   # linears stored in bf16
    ids = torch.randint(2, 32, (3, 8), generator=torch.Generator().manual_seed(2))
    with autocast(torch.device("cpu"), "bf16"):
        a, b = plain.logprobs(ids, torch.ones_like(ids), 4, 1.0), off.logprobs(ids, torch.ones_like(ids), 4, 1.0)
    assert torch.equal(a, b)


def test_lora_reference_is_never_offloaded():
    from grpo.config import LoraConfig
    from grpo.modeling.lora import apply_lora

    peft_model = apply_lora(tiny_qwen2(), LoraConfig(enabled=True, r=2, target_modules=("q_proj",)))
    assert isinstance(build_reference(peft_model, 0.04, offload="disk"), AdapterDisabled)
