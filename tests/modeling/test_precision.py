"""grpo/modeling/precision.py and `train.precision`: bf16 autocast trains like fp32 with float32 master weights;
fp16 scales its loss and skips overflowing steps; bad values are one-line config errors."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo.config import AlgorithmConfig, ConfigError, OptimConfig, build_config
from grpo.modeling.logprobs import completion_logprobs, fixed_logprobs
from grpo.modeling.models import build_model, build_tokenizer
from grpo.modeling.precision import (active_dtype, autocast, autocast_dtype, cast_frozen_linears, cast_trainable_linears,
                            loss_scaler, paused, rollout_autocast, rollout_precision)
from grpo.rollout import sample
from grpo.types import TrainBatch
from grpo.training.update import UpdateSettings, build_optimizer, policy_update
from grpo.rollout.params import Prompts, SamplingParams
from tests.run_helpers import final_weights, make_micro_dir, make_reward, records, run_in_process, tiny_config

CPU = torch.device("cpu")


def micro_policy(seed: int = 0):
    tok = build_tokenizer()
    return build_model(tok, "micro", seed=seed), tok


def rollout_batch(model, tok, seed: int = 0) -> TrainBatch:
    """8 sampled completions (2 prompts x G = 4) with old / reference log-probs a little off the policy's
    (so the ratio and the KL are not trivially 1 and 0) and advantages of non-zero mean (a loss of O(1))."""
    g = torch.Generator().manual_seed(seed)
    enc = tok(["12+7=", "3*4="], return_tensors="pt", padding=True)
    gen = sample(model, Prompts(enc["input_ids"], enc["attention_mask"]),
                 SamplingParams(n=4, max_tokens=8, stop_token_ids=(tok.eos_token_id,), seed=seed),
                 pad_token_id=tok.pad_token_id)
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)                 # [8, P + T]
    mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)              # [8, P + T]
    T = gen.completion_ids.shape[1]
    logp = fixed_logprobs(model, ids, mask, T)                              # [8, T] float32
    on = gen.completion_mask.float()
    old = (logp + 0.05 * torch.randn(logp.shape, generator=g)) * on
    ref = (logp + 0.2 * torch.randn(logp.shape, generator=g)) * on
    adv = 1.0 + 0.5 * torch.randn(8, generator=g)                           # [8]
    return TrainBatch(ids, mask, on, adv, old, ref)


def one_update(model, batch, precision: str, scaler=None):
    """One policy_update of `model` on `batch` under `precision`'s autocast; returns (stats, optimizer)."""
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-3), 10)
    algo = AlgorithmConfig(beta=0.04, num_iterations=2, entropy_coef=0.01)
    with autocast(CPU, precision):
        stats = policy_update(model, opt, sched, batch, algo,
                              UpdateSettings(temperature=1.0, micro_batch_size=3, max_grad_norm=1.0, scaler=scaler))
    return stats, opt


def test_autocast_context_per_precision():
    with autocast(CPU, "fp32"):
        assert active_dtype(CPU) is None and not torch.is_autocast_enabled("cpu")
    with autocast(CPU, "bf16"):
        assert active_dtype(CPU) is torch.bfloat16
    with autocast(torch.device("cpu"), "fp16"):
        assert active_dtype(CPU) is torch.float16
    assert active_dtype(CPU) is None                                         # left again
    assert autocast_dtype("bf16") is torch.bfloat16 and autocast_dtype("fp32") is None
    with pytest.raises(ValueError, match="train.precision"):
        autocast_dtype("int8")


def test_rollout_precision_follows_train_precision_on_auto_and_takes_verl_spellings():
    assert rollout_precision("auto", "fp32") == "fp32" and rollout_precision("auto", "bf16") == "bf16"
    assert rollout_precision("bfloat16", "fp32") == "bf16" and rollout_precision("float32", "bf16") == "fp32"
    assert rollout_precision("fp16", "fp32") == "fp16"
    with pytest.raises(ValueError, match="rollout.precision"):
        rollout_precision("int8", "fp32")


@pytest.mark.parametrize("train, rollout, expected", [
    ("fp32", "auto", None), ("fp32", "fp32", None), ("fp32", "bf16", torch.bfloat16), ("fp32", "bfloat16", torch.bfloat16),
    ("bf16", "auto", torch.bfloat16), ("bf16", "fp32", None), ("bf16", "fp16", torch.float16),
])
def test_rollout_autocast_inside_the_runs_autocast(train, rollout, expected):
    """The rollout's context nests in train.precision's: it switches autocast on, off or to another dtype,
    and the run's own autocast is back afterwards."""
    with autocast(CPU, train):
        with rollout_autocast(CPU, rollout, train):
            assert active_dtype(CPU) is expected
        assert active_dtype(CPU) is autocast_dtype(train)


def test_bf16_rollout_beside_fp32_training_samples_from_the_bf16_policy():
    """rollout.precision bf16 under train.precision fp32: the sampler's log-probs are those of a bf16-autocast
    rollout (bit for bit), differ from the float32 rollout's by bfloat16 rounding only, and the policy's weights
    stay float32 and untouched."""
    model, tok = micro_policy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    enc = tok(["12+7=", "3*4="], return_tensors="pt", padding=True)
    prompts, pad = Prompts(enc["input_ids"], enc["attention_mask"]), tok.pad_token_id
    params = SamplingParams(n=4, max_tokens=8, stop_token_ids=(-1,), seed=3)
    with autocast(CPU, "fp32"):
        with rollout_autocast(CPU, "bf16", "fp32"):
            ours = sample(model, prompts, params, pad_token_id=pad)
        exact = sample(model, prompts, params, pad_token_id=pad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        direct = sample(model, prompts, params, pad_token_id=pad)
    assert torch.equal(ours.completion_ids, direct.completion_ids)
    assert torch.equal(ours.sampling_logprobs, direct.sampling_logprobs)
    same = (ours.completion_ids == exact.completion_ids).long().cumprod(1).bool()   # [8, T] same tokens so far
    gap = (ours.sampling_logprobs - exact.sampling_logprobs)[same].abs()
    assert same.any() and 0 < gap.max() < 0.05                              # bf16 rounding, not another policy
    assert all(p.dtype is torch.float32 for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_config_checks_rollout_precision_in_one_line():
    with pytest.raises(ConfigError) as info:
        build_config(overrides={"rollout.precision": "int8"})
    message = str(info.value)
    assert message.startswith("rollout.precision must be one of auto") and "int8" in message and "\n" not in message
    assert build_config().rollout.precision == "auto"
    assert build_config(overrides={"rollout.precision": "bfloat16"}).rollout.precision == "bfloat16"


@pytest.mark.parametrize("bad", ["bf17", "float16", "FP32"])
def test_config_rejects_unknown_precision_in_one_line(bad):
    with pytest.raises(ConfigError) as info:
        build_config(overrides={"train.precision": bad})
    message = str(info.value)
    assert message.startswith("train.precision must be fp32 | bf16 | fp16") and bad in message and "\n" not in message
    assert build_config(overrides={"train.precision": "bf16"}).train.precision == "bf16"
    assert build_config().train.precision == "fp32"


def test_fp16_needs_float32_weights():
    with pytest.raises(ConfigError, match="train.precision=fp16 needs model.dtype=float32"):
        build_config(overrides={"train.precision": "fp16", "model.dtype": "bfloat16"})


def test_bf16_step_matches_fp32_with_float32_master_weights():
    model, tok = micro_policy()
    batch = rollout_batch(model, tok)
    fp32_model, bf16_model = copy.deepcopy(model), copy.deepcopy(model)
    ref_stats, _ = one_update(fp32_model, batch, "fp32")
    stats, opt = one_update(bf16_model, batch, "bf16")
    assert not stats.skipped and abs(ref_stats.loss) > 0.1                   # a loss of O(1), not ~0
    assert abs(stats.loss - ref_stats.loss) <= 1e-2 * abs(ref_stats.loss)
    assert abs(stats.kl - ref_stats.kl) <= 0.05 * abs(ref_stats.kl)
    assert abs(stats.entropy - ref_stats.entropy) <= 1e-2 * ref_stats.entropy
    # the gradients point the same way (bf16 rounding perturbs each component a little)
    g32 = torch.cat([p.grad.flatten() for p in fp32_model.parameters()])
    g16 = torch.cat([p.grad.flatten() for p in bf16_model.parameters()])
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99
    # master weights, gradients and AdamW state stay float32
    assert {p.dtype for p in bf16_model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in bf16_model.parameters()} == {torch.float32}
    states = [s for s in opt.state.values()]
    assert states and {s["exp_avg"].dtype for s in states} == {s["exp_avg_sq"].dtype for s in states} == {torch.float32}


def test_logprobs_are_float32_under_bf16_autocast():
    model, tok = micro_policy()
    batch = rollout_batch(model, tok)
    T = batch.completion_length
    plain, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, T)
    with autocast(CPU, "bf16"):
        logp, ent = completion_logprobs(model, batch.input_ids, batch.attention_mask, T, with_entropy=True)
    assert logp.dtype is torch.float32 and ent.dtype is torch.float32
    on = batch.completion_mask.bool()
    assert (logp - plain)[on].abs().max() < 0.05 and (logp - plain)[on].abs().max() > 0   # bf16 matmuls did run


def test_bf16_rollout_logprobs_agree_with_the_training_pass():
    """Under bf16 autocast the sampler's log-probs (lean decoder, float32 softmax) and the chunked training
    pass over the same tokens agree within bfloat16 rounding, as they do exactly in float32."""
    model, tok = micro_policy()
    enc = tok(["12+7=", "3*4="], return_tensors="pt", padding=True)
    with autocast(CPU, "bf16"):
        gen = sample(model, Prompts(enc["input_ids"], enc["attention_mask"]),
                     SamplingParams(n=4, max_tokens=8, stop_token_ids=(tok.eos_token_id,), seed=0),
                     pad_token_id=tok.pad_token_id)
        ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)             # [8, P + T]
        mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
        logp = fixed_logprobs(model, ids, mask, gen.completion_ids.shape[1])  # [8, T]
    assert gen.sampling_logprobs.dtype is torch.float32 and logp.dtype is torch.float32
    on = gen.completion_mask.bool()
    assert (logp - gen.sampling_logprobs)[on].abs().max() < 0.02


def test_frozen_linears_are_cast_once_with_autocast_values():
    """A frozen model (the reference) under bf16 autocast: its linear weights are swapped for bfloat16
    copies for the pass (same log-probs as autocast's per-call casts), then the float32 originals return;
    the tied LM head gets its own copy while the embedding keeps float32."""
    model, tok = micro_policy()
    ref = copy.deepcopy(model).requires_grad_(False)
    batch = rollout_batch(model, tok)
    T = batch.completion_length
    originals = {n: p for n, p in ref.named_parameters()}
    with autocast(CPU, "bf16"):
        per_call = completion_logprobs(ref, batch.input_ids, batch.attention_mask, T)[0]   # autocast casts each call
        with cast_frozen_linears(ref, CPU):
            assert ref.lm_head.weight.dtype is torch.bfloat16
            assert ref.model.layers[0].mlp.up_proj.weight.dtype is torch.bfloat16
            assert ref.model.embed_tokens.weight.dtype is torch.float32
            assert ref.model.norm.weight.dtype is torch.float32
            once = completion_logprobs(ref, batch.input_ids, batch.attention_mask, T)[0]
        assert torch.equal(once, per_call)
    assert all(p is originals[n] and p.dtype is torch.float32 for n, p in ref.named_parameters())
    with cast_frozen_linears(ref, CPU):                                      # no autocast: nothing swapped
        assert ref.lm_head.weight is originals["model.embed_tokens.weight"]       # still tied
    with autocast(CPU, "bf16"), cast_frozen_linears(model, CPU):           # trainable weights: left to autocast
        assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_reference_stores_linears_in_the_autocast_dtype_with_the_same_logprobs():
    """train.precision bf16 with a fixed reference: its linear weights are stored in bfloat16 for good
    (half their bytes), and its log-probs under autocast equal those of a float32 copy cast per pass."""
    from grpo.modeling.reference import FrozenCopy, build_reference

    model, tok = micro_policy()
    batch = rollout_batch(model, tok)
    T = batch.completion_length
    stored, plain = build_reference(model, 0.04, torch.bfloat16), FrozenCopy(model)
    bytes_ = {name: sum(p.numel() * p.element_size() for p in ref.model.parameters())
              for name, ref in (("stored", stored), ("plain", plain))}
    linear = sum(p.numel() for m in plain.model.modules() if isinstance(m, torch.nn.Linear)
                 and m is not plain.model.lm_head for p in m.parameters())            # weights and biases
    head = plain.model.lm_head.weight.numel()
    assert bytes_["stored"] == bytes_["plain"] - 2 * linear + 2 * head      # linears halved, head's own copy
    assert stored.model.model.layers[0].self_attn.q_proj.weight.dtype is torch.bfloat16
    assert stored.model.model.embed_tokens.weight.dtype is torch.float32
    assert stored.model.lm_head.weight is not stored.model.model.embed_tokens.weight
    with autocast(CPU, "bf16"):
        a = stored.logprobs(batch.input_ids, batch.attention_mask, T, 1.0)
        b = plain.logprobs(batch.input_ids, batch.attention_mask, T, 1.0)
    assert torch.equal(a, b)
    assert {p.dtype for p in model.parameters()} == {torch.float32}        # the policy is untouched


def test_trainer_keeps_a_refreshed_reference_in_float32(tmp_path):
    """The trainer stores the reference in bf16 only when it never changes (ref_update_steps = 0): mixing
    into bfloat16 weights would lose small updates to rounding."""
    from grpo.api.trainer import Trainer
    from grpo.training.loop import Job, initial_state

    model_dir, reward = make_micro_dir(tmp_path / "micro"), make_reward(tmp_path)
    dtypes = {}
    for steps in (0, 2):
        cfg = tiny_config(model_dir, reward, tmp_path / f"out{steps}", **{"train.precision": "bf16",
                                                                         "algorithm.ref_update_steps": steps})
        t = Trainer(config=cfg)
        state, _ = initial_state(Job(t.config, t.model, t.tokenizer, t.records, t.rewards, t.step_rewards,
                                     t.runtime, t.callbacks))
        dtypes[steps] = state.reference.model.lm_head.weight.dtype
    assert dtypes == {0: torch.bfloat16, 2: torch.float32}


@pytest.mark.parametrize("mode", ["onednn", "aten"])
def test_trainable_casts_give_autocast_values_and_gradients(mode, monkeypatch):
    """The update's casts of trainable weights of the CPU runtime's linears (oneDNN's DnnLinear; aten's
    GradIntoLinear with `cpu.grad_in_place`), made once, a new autograd node at each use, give autocast's own
    log-probs bit for bit, and its gradients up to the order of accumulation: a weight used twice in a
    micro-batch (shared prompt pass, then completions) has its two bfloat16 gradients summed in float32 here,
    in bfloat16 by autocast's cached cast, so these are a little closer to float32's."""
    from contextlib import nullcontext

    from grpo.cpu.kernels import DnnLinear
    from grpo.cpu.placement import use_cpu_matmul
    from grpo.cpu.grad_in_place import GradIntoLinear

    model, tok = micro_policy()
    batch = rollout_batch(model, tok)
    kind = DnnLinear if mode == "onednn" else GradIntoLinear
    use_cpu_matmul(model, mode, grad_in_place=mode == "aten")
    linears = [m for m in model.modules() if type(m) is kind]
    assert linears

    def logp_and_grads(precision, casts):
        model.zero_grad(set_to_none=True)
        with autocast(CPU, precision), casts:
            logp, _ = completion_logprobs(model.train(), batch.input_ids, batch.attention_mask, batch.completion_length)
            (logp * batch.completion_mask).sum().backward()
        return logp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    exact = logp_and_grads("fp32", nullcontext())
    plain = logp_and_grads("bf16", nullcontext())
    with cast_trainable_linears(model, CPU):
        assert all(m.cast_weight is None for m in linears)                  # no autocast: nothing cast
    from grpo.modeling import in_place

    uses = []
    real = in_place.ReusedCast.forward
    monkeypatch.setattr(in_place.ReusedCast, "forward",
                        staticmethod(lambda ctx, w, c, into=False: uses.append(w) or real(ctx, w, c, into)))
    casts = cast_trainable_linears(model, CPU)
    cast = logp_and_grads("bf16", casts)
    assert all(m.cast_weight is None for m in linears)                      # dropped after the block
    head = model.get_output_embeddings()                                    # its products: fused_head's, with the cast
    assert {id(m.weight) for m in linears if m is not head} <= {id(w) for w in uses}   # each layer used its cast
    assert torch.equal(plain[0], cast[0]) and cast[1].dtype is torch.float32
    assert (cast[1] - plain[1]).norm() < 1e-3 * plain[1].norm()
    assert (cast[1] - exact[1]).norm() <= (plain[1] - exact[1]).norm()


def test_fp16_scaler_scales_and_skips_an_overflowing_step():
    model, tok = micro_policy()
    batch = rollout_batch(model, tok)
    clean = copy.deepcopy(model)
    stats, opt = one_update(clean, batch, "fp16")
    scaler = loss_scaler(opt, CPU)
    assert not stats.skipped and scaler.get_scale() == 2.0 ** 16            # one clean step: scale kept
    assert loss_scaler(opt, CPU) is scaler                                   # kept with the optimizer
    assert any(not torch.equal(a, b) for a, b in zip(clean.parameters(), model.parameters()))
    assert {p.dtype for p in clean.parameters()} == {torch.float32}

    before = [p.detach().clone() for p in model.parameters()]
    huge = torch.amp.GradScaler("cpu", init_scale=2.0 ** 60)                # loss x 2^60: float16 gradients overflow
    stats, opt = one_update(model, batch, "fp16", scaler=huge)
    assert stats.skipped and huge.get_scale() == 2.0 ** 59                   # skipped, the scale halved
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in opt.state.values())   # never stepped


def test_training_runs_in_every_precision_with_float32_checkpoints(tmp_path):
    model_dir, reward = make_micro_dir(tmp_path / "micro"), make_reward(tmp_path)
    losses = {}
    for precision in ("fp32", "bf16", "fp16"):
        out = tmp_path / precision
        result = run_in_process(tiny_config(model_dir, reward, out, **{"train.precision": precision,
                                                                       "train.max_steps": 3, "train.save_steps": 0}))
        assert result.steps == 3 and active_dtype(CPU) is None
        losses[precision] = [r["loss/total"] for r in records(out)]
        weights = final_weights(out / "checkpoint-3")
        assert {t.dtype for t in weights.values()} == {torch.float32}
    for precision in ("bf16", "fp16"):                                       # the same run, up to rounding
        assert losses[precision] == pytest.approx(losses["fp32"], rel=0.2, abs=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bfloat16_weights_train_in_bfloat16(tmp_path, precision):
    """model.dtype=bfloat16: weights, gradients and AdamW state in bfloat16 (pure bf16 compute with
    precision fp32; autocast adds float32 for the ops it keeps in float32)."""
    model_dir, reward = make_micro_dir(tmp_path / "micro"), make_reward(tmp_path)
    out = tmp_path / "run"
    over = {"model.dtype": "bfloat16", "train.max_steps": 2, "train.save_steps": 0, "train.precision": precision}
    result = run_in_process(tiny_config(model_dir, reward, out, **over))
    assert {p.dtype for p in result.model.parameters()} == {torch.bfloat16}
    assert all(r["loss/total"] == r["loss/total"] for r in records(out))     # finite, not nan


def test_fp16_loss_scale_is_checkpointed_and_restored(tmp_path):
    """The fp16 loss scaler's state goes into optimizer.pt and a resumed run starts from it."""
    from grpo.modeling.precision import loss_scaler

    model_dir, reward = make_micro_dir(tmp_path / "micro"), make_reward(tmp_path)
    out = tmp_path / "run"
    flat = tiny_config(model_dir, reward, out, **{"train.precision": "fp16", "train.max_steps": 2,
                                                  "train.save_steps": 2})
    assert run_in_process(flat).steps == 2
    saved = torch.load(out / "checkpoint-2" / "optimizer.pt", weights_only=True)["loss_scaler"]
    assert saved["scale"] > 0 and saved["_growth_tracker"] == 2               # two clean steps counted
    from grpo.api.trainer import Trainer
    from grpo.state.checkpoint import write_manifest
    from grpo.state.resume import find_checkpoint, restore
    from grpo.training.loop import Job, initial_state

    state = torch.load(out / "checkpoint-2" / "optimizer.pt", weights_only=True)
    state["loss_scaler"]["scale"], state["loss_scaler"]["_growth_tracker"] = 1024.0, 7
    torch.save(state, out / "checkpoint-2" / "optimizer.pt")
    write_manifest(out / "checkpoint-2", 2)                                 # a scale no fresh run has

    t = Trainer(config={**flat, "train.max_steps": 3, "train.resume": "auto"})
    st, _ = initial_state(Job(t.config, t.model, t.tokenizer, t.records, t.rewards, t.step_rewards, t.runtime,
                              t.callbacks))
    restore(st, find_checkpoint(t.config), t.config)
    restored = loss_scaler(st.optimizer, CPU)
    assert restored.get_scale() == 1024.0 and restored._get_growth_tracker() == 7


def test_cast_weight_gradients_go_into_grad_in_place():
    """`cpu.grad_in_place` under bf16: each oneDNN linear's bfloat16 weight gradient is added into the float32
    ``.grad`` in place (no float32 temporary, no AccumulateGrad), over two micro-batches: the same gradients as
    converting and accumulating through autograd, to float32 rounding; the embedding / head and biases too."""
    from grpo.cpu.kernels import DnnLinear
    from grpo.cpu.placement import use_cpu_matmul

    model, tok = micro_policy()
    batch = rollout_batch(model, tok)
    assert use_cpu_matmul(model, "onednn", grad_in_place=True) > 0
    linears = [m for m in model.modules() if isinstance(m, DnnLinear)]
    assert all(m.grad_into for m in linears)

    def grads(into):
        for m in linears:
            m.grad_into = into
        model.zero_grad(set_to_none=True)
        with autocast(CPU, "bf16"), cast_trainable_linears(model, CPU):
            for rows in (slice(0, 2), slice(2, None)):                      # two micro-batches accumulate
                logp, _ = completion_logprobs(model.train(), batch.input_ids[rows], batch.attention_mask[rows],
                                              batch.completion_length)
                with paused(CPU):
                    (logp * batch.completion_mask[rows]).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    through_autograd, in_place = grads(False), grads(True)
    assert in_place.keys() == through_autograd.keys()
    for name, g in through_autograd.items():
        assert in_place[name].dtype == torch.float32
        torch.testing.assert_close(in_place[name], g, rtol=1e-6, atol=1e-6, msg=name)   # summation order only
    assert any(g.abs().sum() > 0 for g in in_place.values())
    assert use_cpu_matmul(model, "onednn", grad_in_place=False) and not any(m.grad_into for m in linears)


def test_add_upcast_adds_bf16_into_float32_block_by_block(monkeypatch):
    """add_upcast_ gives acc.add_(g) exactly, for blocks of rows smaller than, equal to and not dividing the rows,
    and for same-dtype and small tensors (one add)."""
    from grpo.modeling import in_place as grad_in_place

    g = torch.randn(37, 24, dtype=torch.float64).to(torch.bfloat16)
    acc = torch.randn(37, 24)
    expected = acc.clone().add_(g)
    for block in (4 * 24 * 5, 4 * 24, 4 * 24 * 37, 1):                       # 5 rows, 1 row, all rows, < 1 row
        monkeypatch.setattr(grad_in_place, "UPCAST_BLOCK_BYTES", block)
        out = acc.clone()
        assert grad_in_place.add_upcast_(out, g) is out and torch.equal(out, expected)
    same = torch.randn(37, 24)
    assert torch.equal(grad_in_place.add_upcast_(acc.clone(), same), acc + same)
    assert torch.equal(grad_in_place.add_upcast_(torch.zeros(3), g[0, :3]), g[0, :3].float())
