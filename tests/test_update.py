import copy

import pytest
import torch

from grpo.config import AlgorithmConfig, OptimConfig
from grpo.logprobs import completion_logprobs, fixed_logprobs
from grpo.types import TrainBatch
from grpo.update import build_optimizer, micro_batches, policy_update
from tests.conftest import tiny_qwen2


def make_batch(N=6, P=4, T=5, seed=0, vocab=32):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, vocab, (N, P + T), generator=g)
    attention_mask = torch.ones(N, P + T, dtype=torch.long)
    attention_mask[0, :2] = 0                                     # left padding on one prompt
    input_ids[0, :2] = 0
    lengths = torch.tensor([5, 1, 3, 5, 2, 4])[:N]
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    attention_mask[:, P:] = completion_mask.long()
    input_ids[:, P:][completion_mask == 0] = 0                   # right padding after EOS
    adv = torch.randn(N, generator=g)
    return TrainBatch(input_ids, attention_mask, completion_mask, adv, None, None)


def grads_of(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_on_policy_gradient_equals_reinforce_with_group_baseline():
    """ratio = 1, beta = 0: grad L = -1/N sum_i A_i / |o_i| sum_t grad log pi(o_it)."""
    batch = make_batch()
    algo = AlgorithmConfig(beta=0.0)
    m2, m3 = tiny_qwen2(), tiny_qwen2()
    # SGD with lr 0 leaves the gradients of policy_update readable and the weights untouched
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.0)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0)
    policy_update(m2, opt2, sched2, batch, algo, temperature=1.0, micro_batch_size=0, max_grad_norm=0.0)
    m3.train()
    logp, _ = completion_logprobs(m3, batch.input_ids, batch.attention_mask, 5)
    mask = batch.completion_mask
    reinforce = -((batch.advantages / mask.sum(1)) * (logp * mask).sum(1)).mean()
    reinforce.backward()
    assert torch.allclose(grads_of(m2), grads_of(m3), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("beta,mu", [(0.0, 1), (0.04, 2)])
def test_micro_batched_update_equals_full_batch(beta, mu):
    batch = make_batch()
    base = tiny_qwen2()
    if beta > 0:
        batch.ref_logprobs = fixed_logprobs(tiny_qwen2(seed=1), batch.input_ids, batch.attention_mask, 5)
    if mu > 1:  # stored old log-probs, slightly off-policy
        batch.old_logprobs = fixed_logprobs(base, batch.input_ids, batch.attention_mask, 5) + 0.05
    algo = AlgorithmConfig(beta=beta, num_iterations=mu)
    results = []
    for mb in (0, 2, 4):
        model = copy.deepcopy(base)
        # SGD: the update is linear in the gradient, so 1e-6 is meaningful (Adam divides near-zero
        # gradients by their own magnitude and would amplify float rounding noise).
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        for _ in range(mu):
            stats = policy_update(model, opt, sched, batch, algo, temperature=0.7, micro_batch_size=mb,
                                  max_grad_norm=1.0)
        results.append((torch.cat([p.detach().flatten() for p in model.parameters()]), stats))
    (full, s_full), *others = results
    assert not torch.allclose(full, torch.cat([p.flatten() for p in base.parameters()]))  # it did learn
    for params, stats in others:
        assert torch.allclose(full, params, atol=1e-6)
        assert stats.loss == pytest.approx(s_full.loss, abs=1e-6)
        assert stats.clip_fraction == pytest.approx(s_full.clip_fraction)


def test_right_padding_does_not_change_model_logprobs():
    model = tiny_qwen2()
    batch = make_batch()
    a, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, 5)
    ids = torch.cat([batch.input_ids, torch.full((6, 3), 7)], dim=1)          # 3 more pad columns
    mask = torch.cat([batch.attention_mask, torch.zeros(6, 3, dtype=torch.long)], dim=1)
    b, _ = completion_logprobs(model, ids, mask, 8)
    m = batch.completion_mask.bool()
    assert torch.allclose(a[m], b[:, :5][m], atol=1e-6)


def test_nonfinite_step_is_skipped():
    model = tiny_qwen2()
    before = [p.detach().clone() for p in model.parameters()]
    batch = make_batch()
    batch.advantages[0] = float("nan")
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-2), 1)
    stats = policy_update(model, opt, sched, batch, AlgorithmConfig(beta=0.0), temperature=1.0,
                          micro_batch_size=0, max_grad_norm=1.0)
    assert stats.skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_lr_schedule_warmup_and_cosine():
    model = tiny_qwen2()
    opt, sched = build_optimizer(model, OptimConfig(lr=1.0, warmup_steps=3, lr_scheduler="cosine"), 13)
    lrs = []
    for _ in range(13):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[8] == pytest.approx(0.5)                 # halfway through the 10 decay steps
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
