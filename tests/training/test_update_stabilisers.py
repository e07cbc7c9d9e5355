"""DeepSeek-V3.2's stabilisers and TIS / MIS wired through policy_update (grpo/training/update.py)."""

from __future__ import annotations

import pytest
import torch

from grpo.config import AlgorithmConfig
from grpo.modeling.logprobs import fixed_logprobs
from tests.conftest import tiny_qwen2
from tests.training.test_update import make_batch, update_grads


def with_ref_and_sampler(offset: float = 0.0):
    """The make_batch batch with reference log-probs (policy - 0.3) and sampler log-probs (policy + offset)."""
    batch = make_batch()
    logp = fixed_logprobs(tiny_qwen2(), batch.input_ids, batch.attention_mask, 5)          # [6, 5]
    batch.ref_logprobs = logp - 0.3
    batch.sampling_logprobs = (logp + offset) * batch.completion_mask
    return batch, logp


def test_all_stabilisers_micro_batched_equal_full_batch():
    batch, _ = with_ref_and_sampler(0.4)
    batch.beta = torch.tensor([0.04, 0.0, 0.1, 0.04, 0.0, 0.2], device="cpu")
    batch.old_logprobs = fixed_logprobs(tiny_qwen2(), batch.input_ids, batch.attention_mask, 5) - 0.1
    algo = AlgorithmConfig(beta=0.04, kl_ratio_correction=True, off_policy_mask={"name": "kl", "threshold": 0.2},
                           rollout_correction={"name": "token_truncate", "max": 1.2})
    (full, s_full), (mb2, s_mb2) = update_grads(batch, algo), update_grads(batch, algo, micro_batch_size=2)
    assert torch.allclose(full, mb2, atol=1e-6, rtol=1e-4)
    assert s_full.loss == pytest.approx(s_mb2.loss, abs=1e-6)


def test_off_policy_mask_drops_exactly_the_far_negative_sequences():
    """Sampler log-probs 1.0 above the policy's on every token: mean log(pi_sampler/pi_theta) = 1 > 0.5, so every
    A < 0 completion leaves the loss; with beta = 0 that is the update with those advantages set to 0."""
    batch, _ = with_ref_and_sampler(1.0)
    masked, _ = update_grads(batch, AlgorithmConfig(beta=0.0, off_policy_mask={"name": "kl", "threshold": 0.5}))
    plain = make_batch()
    plain.advantages = torch.where(plain.advantages < 0, 0.0, plain.advantages)
    expected, _ = update_grads(plain, AlgorithmConfig(beta=0.0))
    assert (make_batch().advantages < 0).any()
    torch.testing.assert_close(masked, expected, rtol=1e-5, atol=1e-7)
    kept, _ = update_grads(batch, AlgorithmConfig(beta=0.0, off_policy_mask={"name": "kl", "threshold": 1.5}))   # 1 <= 1.5: none dropped
    torch.testing.assert_close(kept, update_grads(make_batch(), AlgorithmConfig(beta=0.0))[0], rtol=1e-5, atol=1e-7)


def test_rollout_correction_is_identity_when_the_sampler_agrees_and_scales_when_it_does_not():
    """pi_sampler = pi_theta (same numeric path): weight 1, the plain update. pi_sampler = pi_theta - ln 2 on every
    token, token_truncate with C_max = 3: weight 2 everywhere, so the policy gradient doubles (beta = 0)."""
    same, _ = with_ref_and_sampler(0.0)
    corrected, _ = update_grads(same, AlgorithmConfig(beta=0.0, rollout_correction="token_truncate"))
    plain, _ = update_grads(make_batch(), AlgorithmConfig(beta=0.0))
    torch.testing.assert_close(corrected, plain, rtol=1e-5, atol=1e-7)
    lower, _ = with_ref_and_sampler(-0.6931471805599453)
    doubled, _ = update_grads(lower, AlgorithmConfig(beta=0.0, rollout_correction="token_truncate"))
    torch.testing.assert_close(doubled, 2 * plain, rtol=1e-4, atol=1e-6)


def test_per_row_beta_equal_to_beta_is_the_scalar_update_and_zero_rows_drop_their_kl():
    batch, _ = with_ref_and_sampler()
    scalar, _ = update_grads(batch, AlgorithmConfig(beta=0.05))
    batch.beta = torch.full((6,), 0.05, device="cpu")
    rows, _ = update_grads(batch, AlgorithmConfig(beta=0.05))
    torch.testing.assert_close(rows, scalar, rtol=1e-5, atol=1e-7)
    batch.beta = torch.zeros(6, device="cpu")
    none, _ = update_grads(batch, AlgorithmConfig(beta=0.05))
    torch.testing.assert_close(none, update_grads(make_batch(), AlgorithmConfig(beta=0.0))[0], rtol=1e-5, atol=1e-7)
