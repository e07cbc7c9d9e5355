"""DeepSeek-V3.2's stabilisers (grpo/algorithms/stabilisers.py) and their parity with TRL's GRPO loss.

TRL is not a dependency: `trl_loss` below transcribes TRL 1.x's `GRPOTrainer._compute_loss` (loss types
grpo / bnpo / dr_grpo / dapo, `use_bias_correction_kl`, `off_policy_mask_threshold`, the vLLM importance
sampling ratio) in float64, and a first test pins our loss and gradients to numbers derived by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo.algorithms.loss import AGGREGATIONS, grpo_loss
from grpo.algorithms.stabilisers import (domain_betas, off_policy_sequence_mask, rollout_correction_weights,
                                         unbiased_kl)

CPU = torch.device("cpu")
F64 = torch.float64
LN2 = math.log(2.0)
C = 1.0 - LN2                                   # k3 at ref - logp = ln 2: e^{ln 2} - ln 2 - 1

#: TRL loss_type -> (our loss_agg_mode, normaliser of the whole (single micro-) batch)
TRL_TO_OURS = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm",
               "dapo": "token-mean"}


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64, device=CPU)


def hand_batch():
    """Two completions of lengths 3 and 2 (T = 3); ref - logp = ln 2 on three tokens, 0 elsewhere; A = [1, -0.5]."""
    logp = t([[-1.0, -2.0, -0.5], [-1.5, -1.0, 0.0]])
    ref = logp + t([[LN2, 0.0, LN2], [0.0, LN2, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    return logp, ref, mask, t([1.0, -0.5])


def ours(logp, old, ref, adv, mask, loss_type, level, beta=0.1, correction=True, weight=None, eps=(0.2, 0.28)):
    mode = TRL_TO_OURS[loss_type]
    normalizer = AGGREGATIONS[mode].normalizer(mask, 3)           # L = max_completion_length = 3
    return grpo_loss(logp, old, ref, adv, mask, epsilon=eps[0], epsilon_high=eps[1], beta=beta, agg_mode=mode,
                     normalizer=normalizer, importance_sampling_level=level, kl_ratio_correction=correction,
                     policy_weight=weight).loss


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_kl_ratio_correction_loss_and_gradient_by_hand(loss_type, level):
    """mu = 1 (old = logp.detach(): ratio 1, no clipping), beta = 0.1, c = 1 - ln 2. Per-token losses:
        row 0: -1 + 0.1 [c, 0, c];  row 1: 0.5 + 0.1 [0, c]
    grpo: 1/2 (1/3 (-3 + 0.2c) + 1/2 (1 + 0.1c)) = -1/4 + 7c/120;  bnpo = dapo: (-2 + 0.3c)/5;  dr_grpo: (-2 + 0.3c)/6.
    Gradient of one token's unweighted loss w.r.t. logp_t (d = ref - logp; dk3/dlogp = 1 - e^d; the ratio's own
    gradient adds k3 rho with rho = 1):
        token level:    -A_i + 0.1 (1 - e^d_t + k3_t)      -> d = ln 2: -A_i - 0.1 ln 2;  d = 0: -A_i
        sequence level: -A_i + 0.1 (1 - e^d_t + 1/|o_i| sum_s k3_s)   (rho_i = exp(mean_t log ratio), as TRL)
    times each token's aggregation weight: grpo 1/(N |o_i|), bnpo/dapo 1/5, dr_grpo 1/(N L) = 1/6."""
    logp0, ref, mask, adv = hand_batch()
    logp = logp0.clone().requires_grad_(True)
    loss = ours(logp, logp.detach(), ref, adv, mask, loss_type, level)
    loss.backward()
    expected_loss = {"grpo": -0.25 + 7 * C / 120, "bnpo": (-2 + 0.3 * C) / 5, "dapo": (-2 + 0.3 * C) / 5,
                     "dr_grpo": (-2 + 0.3 * C) / 6}[loss_type]
    assert float(loss.detach()) == pytest.approx(expected_loss, abs=1e-12)
    if level == "token":
        g = t([[-1 - 0.1 * LN2, -1.0, -1 - 0.1 * LN2], [0.5, 0.5 - 0.1 * LN2, 0.0]])
    else:                                              # mean k3: row 0 2c/3, row 1 c/2
        g = t([[-1 + 0.1 * (-1 + 2 * C / 3), -1 + 0.1 * (2 * C / 3), -1 + 0.1 * (-1 + 2 * C / 3)],
               [0.5 + 0.1 * (C / 2), 0.5 + 0.1 * (-1 + C / 2), 0.0]])
    w = {"grpo": t([[1 / 6] * 3, [1 / 4] * 3]), "bnpo": torch.full_like(g, 1 / 5),
         "dapo": torch.full_like(g, 1 / 5), "dr_grpo": torch.full_like(g, 1 / 6)}[loss_type]
    torch.testing.assert_close(logp.grad, g * w * mask, rtol=0, atol=1e-12)


def test_without_the_correction_the_gradient_lacks_the_ratio_term():
    """The uncorrected k3 gradient at d = ln 2 is 0.1 (1 - 2) = -0.1 per token: -1.1 in row 0 (grpo, x 1/6)."""
    logp0, ref, mask, adv = hand_batch()
    logp = logp0.clone().requires_grad_(True)
    ours(logp, logp.detach(), ref, adv, mask, "grpo", "token", correction=False).backward()
    assert float(logp.grad[0, 0]) == pytest.approx(-1.1 / 6, abs=1e-12)
    assert float(logp.grad[1, 1]) == pytest.approx((0.5 - 0.1) / 4, abs=1e-12)

# ---------------------------------------------------------------- TRL's _compute_loss, transcribed


def trl_loss(logp, old, ref, adv, mask, loss_type, level, beta=0.1, eps=(0.2, 0.28), max_len=3,
             bias_correction=True, opsm=None, sampling=None, is_ratio=None):
    """TRL 1.x GRPOTrainer._compute_loss (one process, one micro-batch, grad accumulation 1)."""
    adv = adv.unsqueeze(1)
    if opsm is not None:
        kl_div = (sampling if sampling is not None else old) - logp.detach()
        avg = (kl_div * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        off_policy_mask = ((adv >= 0) | (avg <= opsm)).to(mask.dtype)
    log_ratio = logp - old
    if level == "token":
        log_w = log_ratio
    else:
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    if bias_correction:
        per_token_kl = per_token_kl * coef_1
    coef_2 = torch.clamp(coef_1, 1 - eps[0], 1 + eps[1])
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if opsm is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if is_ratio is not None:
        per_token_loss = per_token_loss * is_ratio
    per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_len)
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)          # dapo: num_items_in_batch


def off_policy_batch():
    """Four completions, pi_old != pi_theta so that some ratios clip on both sides."""
    g = torch.Generator(device="cpu").manual_seed(3)
    logp = -torch.rand(4, 5, generator=g, dtype=F64) * 2
    old = logp + (torch.rand(4, 5, generator=g, dtype=F64) - 0.5) * 0.8
    ref = logp + (torch.rand(4, 5, generator=g, dtype=F64) - 0.5)
    mask = t([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    return logp, old, ref, t([0.7, -1.2, 0.4, -0.3]), mask


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_loss_and_gradients_equal_trl_off_policy(loss_type, level):
    logp0, old, ref, adv, mask = off_policy_batch()
    a, b = logp0.clone().requires_grad_(True), logp0.clone().requires_grad_(True)
    mine = ours(a, old, ref, adv, mask, loss_type, level)
    theirs = trl_loss(b, old, ref, adv, mask, loss_type, level, max_len=3)
    assert float(mine.detach()) == pytest.approx(float(theirs.detach()), abs=1e-12)
    mine.backward()
    theirs.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_off_policy_mask_and_rollout_correction_equal_trl(level):
    """OPSM (threshold 0.05 against the sampler) and sequence-mask MIS (cap 1.2) multiply the policy term as in TRL.
    Sequence weights exp(-sum of the offsets): e^-0.5, e^-0.6, e^0.2 > 1.2 (masked: 0), e^-0.3; mean
    log(pi_sampler / pi_theta) 0.014, 0.090, -0.254, 0.588: rows 1 and 3 (A < 0) are dropped."""
    logp0, old, ref, adv, mask = off_policy_batch()
    sampled = old + t([[0.1] * 5, [0.2] * 5, [-0.05] * 5, [0.3] * 5])
    is_ratio = rollout_correction_weights(old, sampled, mask, "sequence_mask", None, 1.2)
    torch.testing.assert_close(is_ratio.squeeze(1), t([math.exp(-0.5), math.exp(-0.6), 0.0, math.exp(-0.3)]))
    opsm = off_policy_sequence_mask(adv, logp0, sampled, mask, 0.05)
    assert opsm.squeeze(1).tolist() == [1.0, 0.0, 1.0, 0.0]
    a, b = logp0.clone().requires_grad_(True), logp0.clone().requires_grad_(True)
    mine = ours(a, old, ref, adv, mask, "dapo", level, weight=opsm * is_ratio)
    theirs = trl_loss(b, old, ref, adv, mask, "dapo", level, opsm=0.05, sampling=sampled, is_ratio=is_ratio)
    assert float(mine.detach()) == pytest.approx(float(theirs.detach()), abs=1e-12)
    mine.backward()
    theirs.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-12)

# ---------------------------------------------------------------- each piece by hand


def test_unbiased_kl_values():
    """rho = e^{0.5} on token 0 (logp - old = 0.5): k3 e^{0.5}; sequence: rho = exp(mean(0.5, 0)) = e^{0.25}."""
    kl, logp, old, mask = t([[0.2, 0.4]]), t([[-1.0, -2.0]]), t([[-1.5, -2.0]]), t([[1, 1]])
    torch.testing.assert_close(unbiased_kl(kl, logp, old, mask, "token"), t([[0.2 * math.exp(0.5), 0.4]]))
    torch.testing.assert_close(unbiased_kl(kl, logp, old, mask, "sequence"), kl * math.exp(0.25))


def test_off_policy_sequence_mask_drops_only_negative_far_sequences():
    """Mean (log pi_sampler - log pi_theta): rows 0.3, 0.3, 0.0 (padding ignored); delta = 0.2.
    Row 0 A > 0 kept; row 1 A < 0 and far: dropped; row 2 A < 0 but near: kept."""
    logp = t([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    sampled = t([[-0.7, -0.7], [-0.7, 5.0], [-1.0, -1.0]])
    mask = t([[1, 1], [1, 0], [1, 1]])
    keep = off_policy_sequence_mask(t([1.0, -1.0, -1.0]), logp, sampled, mask, 0.2)
    assert keep.squeeze(1).tolist() == [1.0, 0.0, 1.0]
    spread = off_policy_sequence_mask(t([-1.0, -1.0, -1.0]), logp, sampled, mask, math.exp(0.25), "ratio")
    assert spread.squeeze(1).tolist() == [0.0, 0.0, 1.0]       # exp(0.3) > exp(0.25) > exp(0)


def test_rollout_correction_modes():
    """log pi_old - log pi_sampler = [ln 4, ln 0.5, 0] (last masked): token weights 4, 0.5, (1: padding)."""
    old, sampled, mask = t([[math.log(4.0), math.log(0.5), 0.0]]), t([[0.0, 0.0, 0.0]]), t([[1, 1, 0]])
    torch.testing.assert_close(rollout_correction_weights(old, sampled, mask, "token_truncate", None, 3.0),
                               t([[3.0, 0.5, 1.0]]))
    torch.testing.assert_close(rollout_correction_weights(old, sampled, mask, "token_mask", 0.6, 3.0),
                               t([[0.0, 0.0, 1.0]]))
    # sequence: exp(ln 4 + ln 0.5) = 2
    torch.testing.assert_close(rollout_correction_weights(old, sampled, mask, "sequence_truncate", None, 1.5), t([[1.5]]))
    torch.testing.assert_close(rollout_correction_weights(old, sampled, mask, "sequence_mask", None, 3.0), t([[2.0]]))


def test_per_domain_beta_weights_each_rows_kl():
    """beta_by_domain {math: 0.04, code: 0}: the code row's KL leaves the loss; unknown domains take beta."""
    betas = domain_betas(["math", "code", "poetry", None], {"math": 0.04, "code": 0.0}, 0.1, CPU)
    assert betas.tolist() == pytest.approx([0.04, 0.0, 0.1, 0.1])
    logp0, ref, mask, adv = hand_batch()
    loss = ours(logp0, logp0, ref, t([0.0, 0.0]), mask, "bnpo", "token", beta=t([0.04, 0.0]), correction=False)
    assert float(loss) == pytest.approx(0.04 * 2 * C / 5, abs=1e-12)     # row 0's k3 sum 2c, 5 tokens
