import copy
import math

import pytest
import torch

from grpo.config import AlgorithmConfig, OptimConfig
from grpo.modeling.logprobs import (completion_logprobs, entropy_from_logits, fixed_logprobs, logprobs_and_entropy,
                           selective_logprobs)
from grpo.algorithms.shaping import top_entropy_mask
from grpo.types import TrainBatch
from grpo.training.update import UpdateSettings, build_optimizer, policy_update
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
    policy_update(m2, opt2, sched2, batch, algo, UpdateSettings(temperature=1.0, micro_batch_size=0, max_grad_norm=0.0))
    m3.train()
    logp, _ = completion_logprobs(m3, batch.input_ids, batch.attention_mask, 5)
    mask = batch.completion_mask
    reinforce = -((batch.advantages / mask.sum(1)) * (logp * mask).sum(1)).mean()
    reinforce.backward()
    assert torch.allclose(grads_of(m2), grads_of(m3), atol=1e-7, rtol=1e-5)


def test_update_releases_the_lm_heads_kept_buffers():
    """The one-buffer head keeps its [k, V] buffers between calls on the CPU; policy_update frees them after its
    last backward pass, so a rollout never holds them."""
    from grpo.cpu import workspace

    model = tiny_qwen2()
    batch = make_batch()
    workspace.release()
    completion_logprobs(model, batch.input_ids, batch.attention_mask, 5, with_entropy=True)
    assert "head.logits" in workspace.held_names()     # kept after a call (and head.probs without native passes)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    policy_update(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), batch, AlgorithmConfig(beta=0.0),
                  UpdateSettings(temperature=1.0, micro_batch_size=2, max_grad_norm=0.0))
    assert not workspace.held_names()


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
            stats = policy_update(model, opt, sched, batch, algo,
                                  UpdateSettings(temperature=0.7, micro_batch_size=mb, max_grad_norm=1.0))
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
    stats = policy_update(model, opt, sched, batch, AlgorithmConfig(beta=0.0),
                          UpdateSettings(temperature=1.0, micro_batch_size=0, max_grad_norm=1.0))
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


# ---------------------------------------------------------------- entropy with autograd


def test_logprobs_and_entropy_values_and_gradient_match_float64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, 11, generator=g)
    tokens = torch.randint(0, 11, (5, 4), generator=g)
    w1, w2 = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    a = logits.clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(a, tokens, chunk_rows=2)          # checkpointed chunks
    assert torch.allclose(logp, selective_logprobs(logits, tokens), atol=1e-6)
    assert torch.allclose(ent, entropy_from_logits(logits), atol=1e-6)
    ((logp * w1).sum() + (ent * w2).sum()).backward()
    b = logits.double().requires_grad_(True)                            # direct: H = -sum p log p
    lsm = torch.log_softmax(b, dim=-1)
    direct = (lsm.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * w1).sum() - ((lsm.exp() * lsm).sum(-1) * w2).sum()
    direct.backward()
    assert torch.allclose(a.grad.double(), b.grad, atol=1e-5)
    with torch.no_grad():                                               # no-grad path gives the same values
        logp2, ent2 = logprobs_and_entropy(logits, tokens)
    assert torch.allclose(logp2, logp.detach()) and torch.allclose(ent2, ent.detach())


def test_completion_logprobs_entropy_grad_path_agrees_with_the_metric_path():
    model, batch = tiny_qwen2(), make_batch()
    logp, ent = completion_logprobs(model, batch.input_ids, batch.attention_mask, 5, 0.7, with_entropy=True)
    logp_g, ent_g = completion_logprobs(model, batch.input_ids, batch.attention_mask, 5, 0.7, entropy_grad=True)
    assert ent_g.requires_grad and not ent.requires_grad
    assert torch.allclose(logp, logp_g, atol=1e-6) and torch.allclose(ent, ent_g, atol=1e-6)

# ---------------------------------------------------------------- new options through policy_update


def update_grads(batch, algo, micro_batch_size=0, seed=0):
    """Gradients left by one policy_update (SGD with lr 0 keeps the weights) and its stats."""
    model = tiny_qwen2(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    stats = policy_update(model, opt, sched, batch, algo,
                          UpdateSettings(temperature=1.0, micro_batch_size=micro_batch_size, max_grad_norm=0.0))
    return grads_of(model), stats


def manual_grads(loss_fn, seed=0):
    model = tiny_qwen2(seed=seed)
    model.train()
    loss_fn(model).backward()
    return grads_of(model)


def test_entropy_bonus_gradient():
    """beta = 0, on-policy: L = -1/N sum_i A_i/|o_i| sum_t log pi - c/N sum_i 1/|o_i| sum_t H_it."""
    batch, c = make_batch(), 0.05
    got, stats = update_grads(batch, AlgorithmConfig(beta=0.0, entropy_coef=c))
    mask = batch.completion_mask

    def loss(model):
        logp, ent = completion_logprobs(model, batch.input_ids, batch.attention_mask, 5, entropy_grad=True)
        per_seq = lambda v: (v * mask).sum(1) / mask.sum(1)  # noqa: E731
        return -(batch.advantages * per_seq(logp)).mean() - c * per_seq(ent).mean()

    assert torch.allclose(got, manual_grads(loss), atol=1e-7, rtol=1e-5)
    with torch.no_grad():
        _, ent = completion_logprobs(tiny_qwen2().train(), batch.input_ids, batch.attention_mask, 5, with_entropy=True)
    assert stats.entropy_loss == pytest.approx(-c * float(((ent * mask).sum(1) / mask.sum(1)).mean()), rel=1e-5)
    assert stats.entropy == pytest.approx(float((ent * mask).sum() / mask.sum()), rel=1e-5)
    no_bonus, _ = update_grads(batch, AlgorithmConfig(beta=0.0))
    assert not torch.allclose(got, no_bonus)


def test_sequence_level_on_policy_gradient_equals_token_level():
    # mu = 1: s_i = 1, and GSPO-token's gradient is A_i/|o_i| sum_t grad log pi, the same as GRPO's
    batch = make_batch()
    tok, _ = update_grads(batch, AlgorithmConfig(beta=0.0))
    seq, _ = update_grads(batch, AlgorithmConfig(beta=0.0, importance_sampling_level="sequence"))
    assert torch.allclose(tok, seq, atol=1e-7, rtol=1e-5)


def test_kl_in_reward_keeps_kl_out_of_the_loss():
    batch = make_batch()
    batch.ref_logprobs = fixed_logprobs(tiny_qwen2(seed=1), batch.input_ids, batch.attention_mask, 5)
    in_reward, stats = update_grads(batch, AlgorithmConfig(beta=0.5, kl_in="reward"))
    no_kl, _ = update_grads(batch, AlgorithmConfig(beta=0.0))
    in_loss, stats_loss = update_grads(batch, AlgorithmConfig(beta=0.5))
    assert torch.equal(in_reward, no_kl) and not torch.allclose(in_loss, no_kl)
    assert stats.kl_loss == 0.0 and math.isnan(stats.kl) and stats_loss.kl_loss > 0


def test_filtered_completion_mask_selects_the_tokens_that_train():
    """Filters (here: the top 30% entropy tokens) arrive multiplied into completion_mask."""
    batch, rho = make_batch(), 0.3
    with torch.no_grad():
        _, ent = completion_logprobs(tiny_qwen2().train(), batch.input_ids, batch.attention_mask, 5, with_entropy=True)
    keep = top_entropy_mask(ent, batch.completion_mask, rho)
    active = int(batch.completion_mask.sum())
    assert int(keep.sum()) == math.ceil(rho * active)
    batch.completion_mask = keep
    got, _ = update_grads(batch, AlgorithmConfig(beta=0.0, top_entropy_rho=rho))

    def loss(model):
        logp, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, 5)
        return -(batch.advantages * (logp * keep).sum(1) / keep.sum(1).clamp(min=1)).mean()

    assert torch.allclose(got, manual_grads(loss), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("options", [
    dict(policy_loss={"name": "clip", "ratio_c": 1.5}, entropy_coef=0.01),
    dict(importance_sampling_level="sequence", epsilon=0.01, loss_agg_mode="token-mean"),
    dict(loss_agg_mode="token-mean", entropy_coef=0.02, filtered=True),
])
def test_micro_batched_update_equals_full_batch_with_new_options(options):
    batch, options = make_batch(), dict(options)
    if options.pop("filtered", False):                                # a filter zeroes some tokens and rows
        batch.completion_mask = batch.completion_mask * (torch.arange(30).view(6, 5) % 3 != 0)
        batch.completion_mask[1] = 0.0
    batch.advantages = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))    # per-token advantages
    batch.old_logprobs = fixed_logprobs(tiny_qwen2(), batch.input_ids, batch.attention_mask, 5) - 0.6
    algo = AlgorithmConfig(beta=0.0, **options)
    (full, s_full), (mb2, s_mb2) = update_grads(batch, algo), update_grads(batch, algo, micro_batch_size=2)
    assert torch.allclose(full, mb2, atol=1e-6, rtol=1e-4)
    assert s_full.loss == pytest.approx(s_mb2.loss, abs=1e-6)
    assert s_full.dual_clip_fraction == pytest.approx(s_mb2.dual_clip_fraction)
    if "policy_loss" in options:                                      # the dual clip is on
        assert s_full.dual_clip_fraction > 0


def test_train_batch_rows_with_per_token_advantages():
    batch = make_batch()
    batch.advantages = torch.arange(30.0).view(6, 5)
    mb = batch.rows(slice(2, 4))
    assert torch.equal(mb.advantages, batch.advantages[2:4]) and mb.completion_length == 5


def test_entropy_with_grad_keeps_no_vocabulary_sized_tensor_for_backward():
    logits = torch.randn(8, 4, 50).requires_grad_(True)
    tokens = torch.randint(0, 50, (8, 4))
    extra = []                                       # saved tensors that are not views of the logits

    def pack(t):
        if t.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():
            extra.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent = logprobs_and_entropy(logits, tokens, chunk_rows=2)
    assert sum(extra) <= tokens.numel()              # only the chosen token ids; log-softmax is recomputed
    (logp.sum() + ent.sum()).backward()
    assert logits.grad is not None


@pytest.mark.parametrize("chunk,checkpointing", [(1, False), (3, True)])
def test_chunk_size_and_gradient_checkpointing_leave_the_update_unchanged(chunk, checkpointing):
    from grpo.training.update import set_gradient_checkpointing

    batch = make_batch()
    base = tiny_qwen2()
    algo = AlgorithmConfig(beta=0.0, entropy_coef=0.01)
    params = []
    for kw in ({}, {"logprob_chunk_size": chunk, "gradient_checkpointing": checkpointing}):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        policy_update(model, opt, sched, batch, algo,
                      UpdateSettings(temperature=0.7, micro_batch_size=4, max_grad_norm=1.0, **kw))
        assert model.is_gradient_checkpointing == bool(kw.get("gradient_checkpointing"))
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert not torch.allclose(params[0], torch.cat([p.flatten() for p in base.parameters()]))
    assert torch.allclose(params[0], params[1], atol=1e-6)
    set_gradient_checkpointing(model, False)
    assert not model.is_gradient_checkpointing


def test_micro_batches_are_bucketed_by_length():
    from grpo.modeling.logprobs import bucketed_micro_batches

    batch = make_batch()                       # completion lengths 5, 1, 3, 5, 2, 4; row 0 has 2 pad columns
    buckets = [b.tolist() for b in bucketed_micro_batches(batch.attention_mask, 2)]
    assert buckets == [[1, 4], [0, 2], [5, 3]]    # real tokens: 5, 6, 7, 7, 8, 9
    assert bucketed_micro_batches(batch.attention_mask, 0) == [slice(0, 6)]


def test_token_budget_closes_micro_batches():
    from grpo.modeling.logprobs import bucketed_micro_batches

    mask = make_batch().attention_mask         # real tokens per row: 7, 5, 7, 9, 6, 8 -> order 1, 4, 0, 2, 5, 3
    groups = [b.tolist() for b in bucketed_micro_batches(mask, 0, max_tokens=20)]
    # rows of 5, 6 tokens, then a third of 7: 3 x 7 = 21 > 20 closes; 7, 7 then 8: 3 x 8 = 24 closes; 8, 9: 18
    assert groups == [[1, 4], [0, 2], [5, 3]]
    assert [b.tolist() for b in bucketed_micro_batches(mask, 0, max_tokens=1)] == [[1], [4], [0], [2], [5], [3]]
    assert bucketed_micro_batches(mask, 0, max_tokens=54) == [slice(0, 6)]   # 6 x 9 fits
    # greedily 4 + 2 rows (4 x 7 = 28, then 2 x 9); the same 2 micro-batches evened out: 3 x 7 = 21 and 3 x 9 = 27
    assert [b.tolist() for b in bucketed_micro_batches(mask, 4, max_tokens=53)] == [[1, 4, 0], [2, 5, 3]]


def test_micro_batches_are_evened_out_only_within_the_limits():
    from grpo.modeling.logprobs import bucketed_micro_batches, even_split

    mask = torch.ones(16, 75, dtype=torch.long)                  # the grid's rows: 16 x (11 + 64) tokens
    assert [len(b) for b in bucketed_micro_batches(mask, 0, max_tokens=401)] == [4, 4, 4, 4]   # not 5 + 5 + 5 + 1
    assert [len(b) for b in bucketed_micro_batches(mask, 0, max_tokens=256)] == [3, 3, 3, 3, 2, 2]   # 6 either way
    assert even_split([1, 1, 1, 1, 1, 10], 2, 6, 12) is None      # 3 x 10 > 12: the greedy groups stay
    assert even_split([1, 1, 1, 1, 1, 10], 2, 2, 0) is None       # 3 rows > size 2
    assert even_split([2, 3, 4, 5, 6], 2, 0 or 5, 0) == [(0, 3), (3, 5)]   # larger groups first, on the shorter rows
    lengths = torch.tensor([3, 9, 4, 9, 2, 9, 9])                 # greedy at 18 tokens: [2, 3, 4] [9, 9] [9, 9]
    ragged = (torch.arange(9)[None, :] < lengths[:, None]).long()
    groups = bucketed_micro_batches(ragged, 0, max_tokens=18)
    assert sorted(i for g in groups for i in g.tolist()) == list(range(7))
    assert all(len(g) * int(lengths[g].max()) <= 18 for g in groups)


def test_token_budget_update_equals_full_batch():
    batch = make_batch()
    base = tiny_qwen2()
    out = []
    for tokens in (-1, 12):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        policy_update(model, opt, sched, batch, AlgorithmConfig(beta=0.0),
                      UpdateSettings(temperature=1.0, micro_batch_size=0, max_grad_norm=1.0, micro_batch_tokens=tokens))
        out.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert not torch.allclose(out[0], torch.cat([p.flatten() for p in base.parameters()]))
    assert torch.allclose(out[0], out[1], atol=1e-6)


def test_auto_micro_batch_tokens_scales_with_model_width():
    from grpo.training.cpu_runtime import auto_micro_batch_tokens

    assert auto_micro_batch_tokens(tiny_qwen2()) == max(256, 2 ** 20 // (tiny_qwen2().config.hidden_size *
                                                                          tiny_qwen2().config.num_hidden_layers))
    assert auto_micro_batch_tokens(torch.nn.Linear(2, 2)) == 4096           # no config: a fixed budget


def test_planner_counts_lean_layers_only_where_they_run():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo.modeling.lean_layers import use_lean_layers
    from grpo.training.runtime import model_shape
    from grpo.training.cpu_runtime import auto_micro_batch_tokens

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=768, num_hidden_layers=12,
                                             num_attention_heads=12, num_key_value_heads=4, intermediate_size=2048))
    assert not model_shape(model, 4).lean_layers and auto_micro_batch_tokens(model) == 256
    use_lean_layers(model)
    assert auto_micro_batch_tokens(model) == 401    # the stored activations of 256 stock tokens: 256 x 14848 / 9472
    assert model_shape(model, 4).lean_layers and not model_shape(model, 2).lean_layers   # bf16 autocast: stock path


def test_policy_weight_multiplies_the_off_policy_mask_into_lambda_grpos_weights():
    """lambda-GRPO's f_i (with its gradient to lambda) times DeepSeek-V3.2's sequence mask: both on, neither
    replaces the other."""
    from grpo.training.update import policy_weight

    batch = make_batch(N=3)
    batch.advantages = torch.tensor([-1.0, -1.0, 1.0])
    lam = torch.tensor(0.5, requires_grad=True)

    class Preference:
        def weights(self, h, pos):
            return torch.stack([lam * 2, lam * 4, lam * 6]).unsqueeze(1)          # [3, 1]

    mask = batch.completion_mask
    logp = torch.zeros(3, 5)
    old = torch.zeros(3, 5)
    logp[0] = -5.0                 # row 0: far from the sampler and negative -> masked; row 2 far but positive
    logp[2] = -5.0
    algo = AlgorithmConfig(off_policy_mask={"name": "kl", "threshold": 0.5})
    w = policy_weight(algo, logp, old, batch, Preference(), (None, None))
    assert w.shape == (3, 1)
    assert torch.equal(w.detach().flatten(), torch.tensor([0.0, 2.0, 3.0]))
    w.sum().backward()
    assert lam.grad.item() == 10.0                                              # d(4 lam + 6 lam)/d lam
    assert mask.sum() > 0


def test_the_loss_statistics_are_read_once_per_update_not_per_micro_batch():
    """The loss statistics are added up on the device and read once per step: on a GPU every read of a device
    value (``float()``, ``.item()``) stalls the host until the queued kernels have run. Counts the device-to-host
    scalar reads (``aten._local_scalar_dense``) made by the loss and the update loop (grpo/algorithms/loss.py,
    grpo/training/update.py) in one update of 1 and of 6 micro-batches. (The forward's data-dependent shapes,
    trimming padding and selecting real tokens, read the mask: those are not counted.)"""
    from tests.conftest import ScalarReads

    batch = make_batch()
    batch.ref_logprobs = fixed_logprobs(tiny_qwen2(seed=1), batch.input_ids, batch.attention_mask, 5)
    batch.sampling_logprobs = fixed_logprobs(tiny_qwen2(), batch.input_ids, batch.attention_mask, 5) + 0.01
    algo = AlgorithmConfig(beta=0.04, entropy_coef=0.01)
    reads, results = {}, {}
    for mb in (0, 1):
        model = tiny_qwen2()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        with ScalarReads("algorithms/loss.py", "training/update.py") as counted:
            results[mb] = policy_update(model, opt, sched, batch, algo,
                                        UpdateSettings(temperature=1.0, micro_batch_size=mb, max_grad_norm=1.0))
        reads[mb] = counted.count
        assert results[mb].rollout_logprob_diff == pytest.approx(0.01, abs=1e-5) and results[mb].kl > 0
    assert reads[0] == reads[1] <= 1, reads                      # at most the gradient norm's
    for field in ("loss", "policy_loss", "kl_loss", "kl", "clip_fraction", "entropy", "entropy_loss"):
        assert getattr(results[1], field) == pytest.approx(getattr(results[0], field), rel=1e-5, abs=1e-7), field


@pytest.mark.parametrize("options", [dict(fused=True), dict(fused=False, foreach=False), dict(amsgrad=True)])
def test_adam_state_made_up_front_is_the_lazy_state_and_trains_identically(options):
    from grpo.training.update import allocate_adam_state

    torch.manual_seed(0)
    weights = [torch.randn(3, 4), torch.randn(5)]
    lazy_params = [w.clone().requires_grad_() for w in weights]
    eager_params = [w.clone().requires_grad_() for w in weights]
    lazy = torch.optim.AdamW(lazy_params, lr=0.1, weight_decay=0.01, **options)
    eager = torch.optim.AdamW(eager_params, lr=0.1, weight_decay=0.01, **options)
    assert allocate_adam_state(eager) == 2 and allocate_adam_state(eager) == 0     # made once
    for p in eager_params:                                    # zeros in the optimizer's own layout, before any step
        assert all(float(v.abs().sum()) == 0 for v in eager.state[p].values())
        assert eager.state[p]["exp_avg"].shape == p.shape and eager.state[p]["step"].dim() == 0
    for step in range(3):
        grads = [torch.randn_like(w) for w in weights]
        for params, opt in ((lazy_params, lazy), (eager_params, eager)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(lazy_params, eager_params):
        assert torch.equal(a, b)
        sa, sb = lazy.state[a], eager.state[b]
        assert sa.keys() == sb.keys()
        for k in sa:
            assert (sa[k].dtype, sa[k].device, sa[k].shape) == (sb[k].dtype, sb[k].device, sb[k].shape)
            assert torch.equal(sa[k], sb[k])
    assert torch.equal(lazy.state_dict()["state"][0]["step"], eager.state_dict()["state"][0]["step"])


def test_build_optimizer_makes_the_adam_state_but_leaves_other_optimizers_alone():
    from grpo.training.update import allocate_adam_state

    model = tiny_qwen2()
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-2), 1)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(opt.state) == len(trainable)
    assert all(opt.state[p]["exp_avg_sq"].shape == p.shape for p in trainable)
    sgd = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1, momentum=0.9)
    assert allocate_adam_state(sgd) == 0 and len(sgd.state) == 0


@pytest.mark.parametrize("onednn", [False, True])
def test_gradient_buffer_trains_bit_for_bit_like_gradients_made_one_by_one(onednn):
    """cpu.grad_buffer: the policy's gradients start as zeroed views of one flat buffer; over 3 micro-batches the
    update (autograd's AccumulateGrad, or oneDNN's in-place blocks and first-product gradients) reaches the same
    parameters exactly, and during the step every gradient is a view of that one buffer."""
    from grpo.cpu.placement import use_cpu_matmul

    batch = make_batch()
    base = tiny_qwen2()
    algo = AlgorithmConfig(beta=0.0)
    params, storages = [], []
    for grad_buffer in (False, True):
        model = copy.deepcopy(base)
        if onednn:
            use_cpu_matmul(model, "onednn", grad_in_place=True)
        opt, sched = build_optimizer(model, OptimConfig(lr=1e-2), 10)
        policy_update(model, opt, sched, batch, algo,
                      UpdateSettings(temperature=0.7, micro_batch_size=2, max_grad_norm=1.0, grad_buffer=grad_buffer))
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        storages.append({p.grad.untyped_storage().data_ptr() for p in model.parameters()})   # the step's gradients
    assert len(storages[0]) > 1 and len(storages[1]) == 1        # one buffer holds every gradient
    assert not torch.equal(params[0], torch.cat([p.flatten() for p in base.parameters()]))
    assert torch.equal(params[0], params[1])


def test_gradient_buffer_gives_zeroed_views_and_leaves_existing_gradients():
    from grpo.cpu.grad_in_place import gradient_buffer

    a, b, c = (torch.nn.Parameter(torch.randn(*s)) for s in ((3, 4), (5,), (2, 2)))
    d = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    c.grad = torch.ones(2, 2)
    buffers = gradient_buffer([a, b, c, d])
    assert [x.shape for x in buffers] == [torch.Size([17]), torch.Size([3])]       # float32 a, b; float64 d
    assert buffers[0].dtype == torch.float32 and buffers[1].dtype == torch.float64
    assert a.grad.shape == (3, 4) and b.grad.shape == (5,) and d.grad.shape == (3,)
    assert all(float(p.grad.abs().sum()) == 0 for p in (a, b, d))
    assert torch.equal(c.grad, torch.ones(2, 2))                                    # left as it was
    a.grad.add_(1.0)
    assert float(buffers[0][:12].sum()) == 12 and float(buffers[0][12:].sum()) == 0  # a view, not a copy
