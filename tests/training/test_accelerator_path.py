"""The CUDA runtime's path, executed with ``meta`` standing in for the GPU (grpo.accelerator.MetaAccelerator).

A model on meta runs forward, backward and an optimizer step with real shapes and no values, and any CPU tensor
meeting its tensors raises. So running the CUDA runtime's code on meta (placing, memory plan, reference pass, one
full update with micro-batches, clipping and the optimizer step, the data-parallel hooks' collective tensors) shows
that every step tensor is made on the device and that the step reads the device exactly where it means to: once,
for its statistics. The host side of the batch (which columns are padding, which rows share a prompt) is what the
rollout holds on the host; on meta it must be given, since meta tensors hold no values.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo.accelerator import ACCELERATORS, MetaAccelerator
from grpo.algorithms.loss import LOSS_STATS
from grpo.config import AlgorithmConfig, Config
from grpo.modeling.reference import build_reference
from grpo.training import distributed
from grpo.training.runtime import meta_runtime
from grpo.training.update import UpdateSettings, build_optimizer, policy_update
from grpo.types import HostView, TrainBatch

P, T, G = 6, 5, 3                      # prompt and completion columns, rows per prompt


def tiny_policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64))


def host_rows() -> HostView:
    """Two prompts x G rows on the host: the first prompt left-padded by 2, completions of 5, 3, 1 tokens and
    trailing padding: what a rollout holds on the host."""
    ids = torch.randint(1, 64, (2 * G, P + T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2 * G, P + T, dtype=torch.long)
    mask[:G, :2] = 0                                      # prompt 0: two padding columns on the left
    for row, length in enumerate([5, 3, 1, 4, 2, 5]):
        mask[row, P + length:] = 0                         # after EOS
    ids = ids * mask
    for g in range(1, G):                                 # the rows of a group share their prompt's tokens
        ids[g, :P], ids[G + g, :P] = ids[0, :P], ids[G, :P]
    return HostView(ids, mask, mask[:, P:].float())


def meta_batch(host: HostView, ref: torch.Tensor | None) -> TrainBatch:
    """The batch as it stands on the device: the same shapes on meta, the host view beside it."""
    on = lambda t: torch.empty_like(t, device="meta")      # noqa: E731  values do not exist on meta
    n = host.input_ids.shape[0]
    return TrainBatch(on(host.input_ids), on(host.attention_mask), on(host.completion_mask),
                      torch.empty(n, device="meta"), None, ref, torch.empty(n, T, device="meta"), host=host)


@pytest.fixture
def runtime(monkeypatch):
    """The CUDA runtime on meta, its accelerator the one every meta tensor's read goes to (a fresh count)."""
    accel = MetaAccelerator()
    monkeypatch.setitem(ACCELERATORS, "meta", accel)
    return meta_runtime(Config(), accel)          # train.micro_batch_tokens 0: from the device's free memory


def test_the_cuda_runtime_places_plans_and_budgets_through_its_accelerator(runtime):
    model = runtime.place(tiny_policy())
    assert {p.device.type for p in model.parameters()} == {"meta"}
    runtime.prepare_process()
    assert runtime.micro_batch_tokens(model) > 10_000     # a quarter of 80 GiB over a tiny model's activations
    assert runtime.memory_budget() == int(0.8 * 80 * 2 ** 30)
    plan = runtime.memory_plan(model, P)
    assert plan.micro_batch_tokens > 0
    runtime.reset_memory_stats()
    assert runtime.memory_metrics() == {"memory/peak_allocated_gib": 0.0}


def test_reference_pass_and_one_full_update_run_on_meta_with_one_device_read(runtime):
    model = runtime.place(tiny_policy())
    cfg = runtime.cfg
    optimizer, scheduler = build_optimizer(model, cfg.optim, total_steps=4)
    host = host_rows()
    reference = build_reference(model, beta=0.04)
    ids, mask = meta_batch(host, None).input_ids, meta_batch(host, None).attention_mask
    ref = reference.logprobs(ids, mask, T, 1.0, micro_batch_size=2, host=host)
    assert ref.device.type == "meta" and ref.shape == (2 * G, T)
    assert runtime.accel.reads == []                       # the reference pass read nothing back

    batch = meta_batch(host, ref)
    stats = policy_update(model, optimizer, scheduler, batch, AlgorithmConfig(beta=0.04),
                          UpdateSettings(temperature=1.0, micro_batch_size=2, max_grad_norm=1.0, micro_batch_tokens=24))
    assert runtime.accel.reads == [(len(LOSS_STATS) + 4,)]   # statistics, entropy, gap, gap tokens, grad norm: once
    assert not stats.skipped                                # the meta read answers zeros: finite
    assert all(p.device.type == "meta" for p in model.parameters())
    moments = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor) and v.dim()]
    assert moments and all(v.device.type == "meta" for v in moments)   # AdamW stepped on the device
    assert scheduler.last_epoch == 1


def test_a_step_tensor_made_on_the_cpu_fails_the_meta_update(runtime):
    model = runtime.place(tiny_policy())
    optimizer, scheduler = build_optimizer(model, runtime.cfg.optim, total_steps=4)
    host = host_rows()
    batch = meta_batch(host, None)
    batch.advantages = torch.zeros(2 * G)                  # made on the host: the CUDA path would move it per use
    with pytest.raises(RuntimeError, match="meta"):
        policy_update(model, optimizer, scheduler, batch, AlgorithmConfig(beta=0.0),
                      UpdateSettings(temperature=1.0, micro_batch_size=0, max_grad_norm=1.0))


def test_a_meta_batch_without_its_host_view_is_refused_by_name(runtime):
    model = runtime.place(tiny_policy())
    optimizer, scheduler = build_optimizer(model, runtime.cfg.optim, total_steps=4)
    batch = meta_batch(host_rows(), None)
    batch.host = None
    with pytest.raises(RuntimeError, match="host view"):
        policy_update(model, optimizer, scheduler, batch, AlgorithmConfig(beta=0.0),
                      UpdateSettings(temperature=1.0, micro_batch_size=0, max_grad_norm=1.0))


def test_the_data_parallel_hooks_keep_their_collective_tensors_on_the_device(runtime, monkeypatch):
    """torchrun's hooks (grpo.training.distributed.Parallel) under NCCL, with meta as the CUDA device: the statistics
    and the gradient norm are reduced as device tensors, and the step still reads the device once."""
    seen = []
    monkeypatch.setitem(ACCELERATORS, "cuda", runtime.accel)            # NCCL's device: the stand-in GPU
    monkeypatch.setattr(distributed, "is_dist", lambda: True)
    monkeypatch.setattr(distributed, "all_gather_object", lambda obj: [obj])
    monkeypatch.setattr(distributed.dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t, op=None: seen.append((t.device.type, t.dtype)))
    model = runtime.place(tiny_policy())
    optimizer, scheduler = build_optimizer(model, runtime.cfg.optim, total_steps=4)
    par = distributed.Parallel(0, 1, 0, "fsdp2", torch.device("meta"), policy=model,
                               wrapped=distributed.LogprobForward(model))   # the module FSDP2 shards, unsharded
    stats = policy_update(model, optimizer, scheduler, meta_batch(host_rows(), None), AlgorithmConfig(beta=0.0),
                          UpdateSettings(temperature=1.0, micro_batch_size=2, max_grad_norm=1.0, parallel=par))
    assert seen == [("meta", torch.float64)]               # the step's statistics, summed on the device
    assert len(runtime.accel.reads) == 1 and not stats.skipped


def test_the_default_accelerators_answer_by_device_type():
    assert isinstance(ACCELERATORS["meta"], MetaAccelerator)
    assert ACCELERATORS["cpu"].read(torch.tensor([1.5, 2.0])) == [1.5, 2.0]
    with pytest.raises(RuntimeError, match="made off the device"):
        MetaAccelerator().read(torch.zeros(2))
