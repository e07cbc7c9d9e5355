"""The memory planner (grpo/training/memory_plan.py): hand-derived estimates, the choice it makes under a
budget, explicit settings winning, the error when nothing fits, and that the checkpointed update it picks for
a tight budget computes the same loss and gradients as the plain one (float64)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import transformers

from grpo.config import AlgorithmConfig, build_config
from grpo.cpu import kernels as cpu_kernels
from grpo.training.memory_plan import (MemoryBudgetError, ModelShape, StepShape, default_chunk, fused_weight_bytes,
                                       gradient_bytes, head_bytes, kv_cache_bytes, moment_bytes, no_grad_budget,
                                       phase_bytes, plan_memory, runtime_allowance, stored_values_per_token)
from grpo.training.runtime import CpuRuntime, model_shape, step_shape
from grpo.training.update import UpdateSettings, build_optimizer, policy_update
from grpo.types import TrainBatch

# hidden 64, intermediate 128, 2 layers, 2 kv heads of 16, vocab 100, 10,000 trainable float32 parameters
M = ModelShape(hidden=64, intermediate=128, layers=2, kv_heads=2, head_dim=16, vocab=100, trainable_params=10_000)
# 4 rows = 2 prompts x G 2, prompts of 8 tokens, 24 new tokens: rows of 32 tokens
S = StepShape(rows=4, prompts=2, prompt_tokens=8, new_tokens=24)
IN_USE = 1_000_000


def test_the_pieces_by_hand():
    assert gradient_bytes(M) + moment_bytes(M) == 10_000 * (4 + 4 + 4)      # gradient + AdamW's two moments
    assert gradient_bytes(M) == 40_000 and moment_bytes(M) == 80_000         # only the update holds gradients
    assert kv_cache_bytes(M, S) == 2 * 2 * 2 * 16 * 4 * (2 * 8 + 4 * 24)     # = 57,344: prompts once, rows each
    assert fused_weight_bytes(M) == 2 * 64 * (64 + 2 * 2 * 16 + 2 * 128) * 4   # = 196,608: q/k/v, gate/up copies
    packed = dataclasses.replace(M, packed_rollout=True)                    # CPU float32: every projection, the head
    assert fused_weight_bytes(packed) == (2 * 64 * (64 + 2 * 2 * 16 + 2 * 128 + 64 + 128) + 100 * 64) * 4  # = 320,512
    packed_bf16 = dataclasses.replace(packed, act_bytes=2)                  # bf16 autocast: packed bf16 casts
    assert fused_weight_bytes(packed_bf16) == 320_512 // 2
    assert fused_weight_bytes(dataclasses.replace(M, param_bytes=2)) == 196_608 // 2    # bf16 weights, no autocast
    # per layer 10 x 64 + 3.5 x 128 = 1088 values; plus 4 x 64 outside the layers
    assert stored_values_per_token(M, False) == 2 * 1088 + 256              # every layer's activations: 2432
    assert stored_values_per_token(M, True) == 2 * 64 + 1088 + 256          # layer inputs + one layer: 1472
    lean = dataclasses.replace(M, lean_layers=True)                          # train.lean_layers: 7 x 64 + 2 x 128
    assert stored_values_per_token(lean, False) == 2 * 704 + 256             # = 1664
    assert default_chunk(100) == 2 ** 23 // 100 == 83_886
    assert head_bytes(M, 83_886, 32) == 3 * 4 * 32 * 100                     # capped at the micro-batch's tokens
    assert head_bytes(M, 16, 32) == 3 * 4 * 16 * 100


def test_the_runtime_allowance_adds_to_every_phase():
    # 128 MiB + 4 B per trainable parameter (measured slack, memory_plan.RUNTIME_BYTES)
    assert runtime_allowance(0) == 128 * 2 ** 20 and runtime_allowance(10_000) == 134_217_728 + 40_000
    slack = dataclasses.replace(M, slack_bytes=runtime_allowance(10_000))
    plain, more = phase_bytes(M, S, IN_USE, 64, False, 64), phase_bytes(slack, S, IN_USE, 64, False, 64)
    assert {k: more[k] - plain[k] for k in plain} == dict.fromkeys(plain, 134_257_728)


def test_an_offloaded_reference_counts_in_the_reference_phase_only():
    off = dataclasses.replace(M, offloaded_ref_bytes=40_000)               # train.ref_offload: loaded for its pass
    plain, more = phase_bytes(M, S, IN_USE, 64, False, 64), phase_bytes(off, S, IN_USE, 64, False, 64)
    assert {k: more[k] - plain[k] for k in plain} == {"rollout": 0, "reference": 40_000, "update": 0}
    model = tiny_qwen2().float()
    n = sum(p.numel() for p in model.parameters())
    assert model_shape(model, 4, None, True).offloaded_ref_bytes == 4 * n and model_shape(model, 4).offloaded_ref_bytes == 0


def test_model_shape_sets_the_allowance_from_trainable_parameters():
    model = tiny_qwen2().float()
    n = sum(p.numel() for p in model.parameters())
    assert model_shape(model, 4).slack_bytes == 128 * 2 ** 20 + 4 * n
    model.model.embed_tokens.weight.requires_grad_(False)                 # frozen weights hold no optimizer state
    frozen = model.model.embed_tokens.weight.numel()
    assert model_shape(model, 4).slack_bytes == 128 * 2 ** 20 + 4 * (n - frozen)


def test_roomy_budget_keeps_the_speed_heuristic_and_no_checkpointing():
    plan = plan_memory(M, S, in_use=IN_USE, budget=10 ** 8, auto_tokens=64)
    assert (plan.micro_batch_tokens, plan.gradient_checkpointing, plan.logprob_chunk_size) == (64, False, 83_886)
    # micro-batch of 2 rows = 64 tokens; in use 1,000,000, moments 80,000, gradients (update only) 40,000;
    # head 3 x 4 x 64 x 100 = 76,800; the no-grad passes take NO_GRAD_TOKENS (704): the whole batch, 128 tokens
    assert dict(plan.phases) == {"rollout": 1_080_000 + 57_344 + 196_608,
                                 "reference": 1_080_000 + 128 * 4096 + 153_600,     # (8 x 64 + 4 x 128) x 4 B
                                 "update": 1_120_000 + 64 * 2432 * 4 + 76_800}
    assert plan.estimate_bytes == 1_819_392 and plan.chosen_by == "planner" and plan.logprob_tokens == 704


def test_tight_budget_turns_checkpointing_on():
    # without checkpointing one row needs 1,120,000 + 32 x 9,728 + head >= 1,455,296 > 1,400,000;
    # with it 1,120,000 + 32 x 5,888 + 38,400 = 1,346,816; 53,184 B left are 9 tokens, not a second row;
    # the update is the peak: the rollout holds no gradients (1,080,000 + 57,344 + 196,608 = 1,333,952)
    plan = plan_memory(M, S, in_use=IN_USE, budget=1_400_000, auto_tokens=64)
    assert (plan.micro_batch_tokens, plan.gradient_checkpointing, plan.logprob_chunk_size) == (32, True, 83_886)
    assert dict(plan.phases)["update"] == 1_346_816 and plan.estimate_bytes == 1_346_816
    assert dict(plan.phases)["rollout"] == 1_333_952


def test_a_smaller_head_chunk_is_tried_before_checkpointing():
    # no checkpointing, one row: 1,469,696 with any chunk >= 32; chunks halve 83886, 41943, ..., 40, 20:
    # at 20 the head is 3 x 4 x 20 x 100 = 24,000 and the update 1,455,296 <= 1,460,000
    plan = plan_memory(M, S, in_use=IN_USE, budget=1_460_000, auto_tokens=64)
    assert (plan.micro_batch_tokens, plan.gradient_checkpointing, plan.logprob_chunk_size) == (32, False, 20)
    assert plan.estimate_bytes == 1_455_296


def test_nothing_fits_is_one_line_naming_the_key_and_the_estimate():
    # leanest: checkpointing, chunk 20: update 1,120,000 + 188,416 + 24,000 = 1,332,416 B, but the rollout needs
    # 1,333,952 B = 0.00124 GiB
    with pytest.raises(MemoryBudgetError, match=r"train\.memory_budget_gib=0\.00121 is too small.*"
                                                r"gradient_checkpointing=true, logprob_chunk_size=20.*0\.00124 GiB") as e:
        plan_memory(M, S, in_use=IN_USE, budget=1_300_000, auto_tokens=64)
    assert "\n" not in str(e.value)


def test_explicit_settings_win():
    with pytest.raises(MemoryBudgetError):          # would fit with checkpointing, but the user said false
        plan_memory(M, S, in_use=IN_USE, budget=1_400_000, auto_tokens=64, gradient_checkpointing=False)
    plan = plan_memory(M, S, in_use=IN_USE, budget=10 ** 8, auto_tokens=64, gradient_checkpointing=True)
    assert plan.gradient_checkpointing and plan.micro_batch_tokens == 64
    # -1 = no limit: all 4 rows (128 tokens) in one micro-batch; only checkpointing is left to choose
    plan = plan_memory(M, S, in_use=IN_USE, budget=2_200_000, auto_tokens=64, micro_batch_tokens=-1)
    assert (plan.micro_batch_tokens, plan.gradient_checkpointing) == (-1, True)
    assert plan.estimate_bytes == 1_120_000 + 128 * 1472 * 4 + 3 * 4 * 128 * 100     # 2,027,264
    plan = plan_memory(M, S, in_use=IN_USE, budget=10 ** 8, auto_tokens=64, micro_batch_tokens=-1,
                       gradient_checkpointing=False, logprob_chunk_size=64)
    assert plan.chosen_by == "user" and plan.estimate_bytes == 1_120_000 + 128 * 2432 * 4 + 3 * 4 * 64 * 100


def test_every_phase_grows_linearly_in_the_completion_length():
    for ckpt in (False, True):
        est = [phase_bytes(M, StepShape(4, 2, 8, T), IN_USE, -1, ckpt, 16) for T in (100, 200, 300, 400)]
        for phase in est[0]:
            steps = {b[phase] - a[phase] for a, b in zip(est, est[1:])}
            assert len(steps) == 1 and steps.pop() > 0, phase


# --- the planner on a real model: the update it picks under a tight budget is the same update ---------

def tiny_qwen2(vocab=48) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.Qwen2ForCausalLM(cfg).double()


def long_batch(N=4, P=6, T=64, vocab=48) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (N, P + T), generator=g)
    mask = torch.ones(N, P + T, dtype=torch.long)
    lengths = torch.tensor([64, 51, 64, 30])                              # two rows ended early (EOS)
    cm = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mask[:, P:] = cm.long()
    return TrainBatch(ids, mask, cm, torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=torch.float64), None, None)


def test_tight_budget_picks_checkpointing_and_the_update_is_unchanged(monkeypatch):
    model = tiny_qwen2()
    P, T = 6, 64
    cfg = build_config(overrides={"rollout.max_new_tokens": T, "rollout.num_generations": 2,
                                  "train.prompts_per_step": 2, "algorithm.beta": 0.0})
    shape, step = model_shape(model, 8), step_shape(cfg, P)
    row = P + T
    on = max(phase_bytes(shape, step, 0, row, True, default_chunk(48)).values())
    off = max(phase_bytes(shape, step, 0, row, False, 16).values())
    assert on < off                                                       # a budget between them exists
    runtime = CpuRuntime(torch.device("cpu"), build_config(overrides={
        "train.memory_budget_gib": on / 2 ** 30, "rollout.max_new_tokens": T, "rollout.num_generations": 2,
        "train.prompts_per_step": 2}))                                    # the budget: exactly the plan we expect
    monkeypatch.setattr(CpuRuntime, "memory_in_use", lambda self: 0)
    monkeypatch.setattr("grpo.training.runtime_plan.model_shape", lambda m, b, d=None, r=False, rd=None: shape)   # float64: 8-byte activations
    plan = runtime.memory_plan(model, P)
    assert plan.gradient_checkpointing and plan.micro_batch_tokens == row and plan.estimate_bytes <= on

    batch, algo = long_batch(), AlgorithmConfig(beta=0.0)
    results = []
    for kw in ({"gradient_checkpointing": False, "micro_batch_tokens": -1},
               {"gradient_checkpointing": plan.gradient_checkpointing, "micro_batch_tokens": plan.micro_batch_tokens,
                "logprob_chunk_size": plan.logprob_chunk_size}):
        m = copy.deepcopy(model)
        opt, sched = build_optimizer(m, cfg.optim, 1)
        stats = policy_update(m, opt, sched, batch, algo,
                              UpdateSettings(temperature=1.0, micro_batch_size=0, max_grad_norm=0.0, **kw))
        assert m.is_activation_checkpointing == kw["gradient_checkpointing"]
        results.append((stats.loss, torch.cat([p.grad.flatten() for p in m.parameters()])))
    (loss0, grad0), (loss1, grad1) = results
    assert grad0.abs().max() > 0
    assert loss1 == pytest.approx(loss0, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad1, grad0, rtol=1e-10, atol=1e-12)


def test_a_checkpointed_plan_trains_on_a_meta_default_device(tmp_path, monkeypatch):
    """Device neutrality of the planned path: the budget forces checkpointing and one row per micro-batch."""
    from grpo.modeling.models import build_model, build_tokenizer
    from tests.training.test_device import changed, run_on_meta_default

    plans, real = [], CpuRuntime.memory_plan

    def tight(self, model, prompt_tokens, optimizer=None, engine="native"):   # budget = the checkpointed one-row estimate exactly
        shape, step = model_shape(model, 4), step_shape(self.cfg, prompt_tokens, engine)
        row = prompt_tokens + step.new_tokens
        on = max(phase_bytes(shape, step, 0, row, True, default_chunk(shape.vocab)).values())
        assert on < max(phase_bytes(shape, step, 0, row, False, 16).values())
        monkeypatch.setattr(CpuRuntime, "memory_budget", lambda self: on)
        plans.append(real(self, model, prompt_tokens, engine=engine))
        return plans[-1]

    monkeypatch.setattr(CpuRuntime, "memory_in_use", lambda self: 0)
    monkeypatch.setattr(CpuRuntime, "memory_plan", tight)
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    before, result, records = run_on_meta_default(tmp_path, model, tok)
    assert len(plans) == 1 and plans[0].gradient_checkpointing and plans[0].chosen_by == "planner"
    assert result.steps == 2 and result.model.is_activation_checkpointing
    assert changed(before, result.model)


def test_a_run_that_cannot_fit_stops_before_its_first_step(tmp_path):
    import grpo

    out = tmp_path / "run"
    trainer = grpo.Trainer(config={"train.output_dir": str(out), "train.max_steps": 1, "train.prompts_per_step": 1,
                                   "rollout.num_generations": 2, "rollout.max_new_tokens": 8,
                                   "data.num_train_prompts": 4, "log.progress_bar": False,
                                   "train.memory_budget_gib": 0.01})     # 10 MiB: less than the process holds
    with pytest.raises(MemoryBudgetError, match=r"^train\.memory_budget_gib=0\.01 is too small: .* needs an "
                                                r"estimated [0-9.]+ GiB \(rollout"):
        trainer.train()
    assert not (out / "metrics.jsonl").exists() and not (out / "config.yaml").exists()


def test_planner_counts_packed_rollout_weights_where_they_are_made():
    """model_shape marks a float32 CPU policy's rollout as packed (grpo.modeling.rollout_weights), so its
    rollout phase counts every projection and the head; bf16 (autocast or weights) only where oneDNN's bf16 is
    native; fp16 autocast and meta / non-CPU weights are not."""
    model = tiny_qwen2().float()
    native = cpu_kernels.onednn_works() and cpu_kernels.bf16_native()
    assert model_shape(model, 4).packed_rollout == cpu_kernels.onednn_works()
    assert not model_shape(tiny_qwen2(), 8).packed_rollout                # float64 weights: no packing
    assert not model_shape(model, 2, torch.float16).packed_rollout        # fp16 autocast: no packing
    assert model_shape(model, 2, torch.bfloat16).packed_rollout == native  # bf16 autocast: packed bf16 casts
    assert model_shape(model.to(torch.bfloat16), 2).packed_rollout == native
    with torch.device("meta"):
        assert not model_shape(tiny_qwen2().float(), 4).packed_rollout


def test_rollout_precision_sizes_the_rollout_phase_only(monkeypatch):
    """rollout.precision bf16 beside an fp32 update: the rollout's weight copies are 2 bytes a value (its KV cache
    stays float32, as the decoder keeps it), the other phases unchanged; model_shape packs for the rollout's dtype,
    and plan_for passes it."""
    import grpo.training.runtime_plan as runtime

    half = dataclasses.replace(M, packed_rollout=True, rollout_bytes=2)
    full = dataclasses.replace(M, packed_rollout=True)
    assert kv_cache_bytes(half, S) == 57_344 and fused_weight_bytes(half) == 320_512 // 2
    assert kv_cache_bytes(dataclasses.replace(M, act_bytes=2), S) == 57_344      # train.precision bf16: float32 too
    assert kv_cache_bytes(dataclasses.replace(M, param_bytes=2), S) == 57_344 // 2   # bf16 weights: a bf16 cache
    a, b = phase_bytes(full, S, IN_USE, 64, False, 64), phase_bytes(half, S, IN_USE, 64, False, 64)
    assert {k: a[k] - b[k] for k in a} == {"rollout": 320_512 // 2, "reference": 0, "update": 0}
    model = tiny_qwen2().float()
    native = cpu_kernels.onednn_works() and cpu_kernels.bf16_native()
    shape = model_shape(model, 4, None, False, torch.bfloat16)
    assert shape.rollout_bytes == 2 and shape.act_bytes == 4 and shape.packed_rollout == native
    assert model_shape(model, 4).rollout_bytes == 0
    seen = []
    monkeypatch.setattr(runtime, "model_shape", lambda *args: seen.append(args[4]) or model_shape(*args))
    for rollout in ("bf16", "auto"):
        runtime.plan_for(CpuRuntime(torch.device("cpu"), build_config(overrides={"rollout.precision": rollout})),
                         model, 8)
    assert seen == [torch.bfloat16, None]


def test_no_grad_passes_take_at_least_no_grad_tokens_unless_configured():
    """train.logprob_micro_batch_tokens: 0 = the update's micro-batch tokens or NO_GRAD_TOKENS (704), whichever is
    larger, -1 = no limit, else as given; the reference phase is estimated at that budget (by hand: M, S above, rows
    of 32 tokens; a no-grad micro-batch costs the moments (80,000), 8 x 64 + 4 x 128 = 1024 values (4096 bytes) per
    token and its head chunk). When the larger auto budget does not fit, the update's is taken."""
    assert no_grad_budget(32) == 704 and no_grad_budget(2048) == 2048 and no_grad_budget(-1) == -1
    assert no_grad_budget(32, 96) == 96 and no_grad_budget(32, -1) == -1
    plan = plan_memory(M, S, in_use=IN_USE, budget=10 ** 9, auto_tokens=32, logprob_chunk_size=64)
    assert (plan.micro_batch_tokens, plan.no_grad_tokens, plan.logprob_tokens) == (32, 704, 704)
    assert dict(plan.phases)["reference"] == IN_USE + 80_000 + 128 * 4096 + 3 * 4 * 64 * 100   # all 4 rows
    # a budget between the update's peak and the reference phase at 704 tokens: the no-grad passes fall back to 32
    update = dict(plan.phases)["update"]
    assert update < dict(plan.phases)["reference"]
    narrow = plan_memory(M, S, in_use=IN_USE, budget=update, auto_tokens=32, logprob_chunk_size=64,
                         gradient_checkpointing=False)
    assert (narrow.micro_batch_tokens, narrow.logprob_tokens) == (32, 32)
    assert dict(narrow.phases)["reference"] == IN_USE + 80_000 + 32 * 4096 + 3 * 4 * 32 * 100
    wide = plan_memory(M, S, in_use=IN_USE, budget=10 ** 9, auto_tokens=32, logprob_chunk_size=64,
                       logprob_micro_batch_tokens=128)
    assert (wide.micro_batch_tokens, wide.logprob_tokens) == (32, 128) and "logprob_micro_batch_tokens=128" in wide.describe()
    assert dict(wide.phases)["reference"] == IN_USE + 80_000 + 128 * 4096 + 3 * 4 * 64 * 100    # 4 rows, chunk of 64
    assert wide.estimate_bytes == max(dict(wide.phases).values())
    with pytest.raises(MemoryBudgetError):   # the no-grad budget counts against train.memory_budget_gib too
        plan_memory(M, S, in_use=IN_USE, budget=dict(plan.phases)["update"] + 1, auto_tokens=32, logprob_chunk_size=64,
                    gradient_checkpointing=False, micro_batch_tokens=32, logprob_micro_batch_tokens=128)


def test_the_optimizers_state_in_memory_is_not_counted_twice(monkeypatch):
    from grpo.training.update import state_bytes

    model = tiny_qwen2()
    cfg = build_config(overrides={"rollout.max_new_tokens": 16, "rollout.num_generations": 2,
                                  "train.prompts_per_step": 2, "train.memory_budget_gib": 8})
    opt, _ = build_optimizer(model, cfg.optim, 1)                 # the moments are made here (allocate_adam_state)
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    held = state_bytes(opt, torch.device("cpu"))
    assert held == 2 * weights + sum(st["step"].element_size() for st in opt.state.values())   # 2 moments + a step
    assert state_bytes(opt, torch.device("meta")) == 0 and state_bytes(None, torch.device("cpu")) == 0
    runtime = CpuRuntime(torch.device("cpu"), cfg)
    measured = 500 * 2 ** 20
    monkeypatch.setattr(CpuRuntime, "memory_in_use", lambda self: measured)
    before = runtime.memory_plan(model, 6)                       # the planner adds the moments to what is in use
    monkeypatch.setattr(CpuRuntime, "memory_in_use", lambda self: measured + held)   # ... which now holds them
    after = runtime.memory_plan(model, 6, opt)
    assert after.estimate_bytes == before.estimate_bytes and after.phases == before.phases


def test_under_vllm_the_rollout_phase_does_not_count_a_cache_vllm_already_holds():
    """vLLM's KV cache is reserved when the engine starts (in use by the time the plan is made) or lives in a
    server: the rollout phase is then what is in use plus the slack and moments, nothing per step on top."""
    from grpo.training.memory_plan import fused_weight_bytes, kv_cache_bytes, moment_bytes

    model = tiny_qwen2()
    cfg = build_config(overrides={"rollout.max_new_tokens": 64, "rollout.num_generations": 8})
    shape = model_shape(model, 4)
    native, vllm = step_shape(cfg, 6), step_shape(cfg, 6, "vllm")
    assert native.own_rollout and not vllm.own_rollout
    mine = phase_bytes(shape, native, 1000, 70, False, 16)
    theirs = phase_bytes(shape, vllm, 1000, 70, False, 16)
    base = 1000 + shape.slack_bytes + moment_bytes(shape)
    assert theirs["rollout"] == base
    assert mine["rollout"] == base + kv_cache_bytes(shape, native) + fused_weight_bytes(shape) > base
    assert mine["update"] == theirs["update"] and mine["reference"] == theirs["reference"]
