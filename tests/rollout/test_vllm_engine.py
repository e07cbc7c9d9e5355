"""The colocated vLLM engine against grpo's own policy, on vLLM's CPU build (run by .ci/run in the vLLM venv:
`make test-vllm`). One engine serves every test of the module (vLLM starts in ~25 s on 2 cores)."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="the vLLM venv (make test-vllm) runs these")   # the main venv has no vLLM

from grpo.config import build_config  # noqa: E402
from grpo.data.prompts import tokenize_prompts  # noqa: E402
from grpo.data.tasks.arithmetic import generate as arithmetic_rows  # noqa: E402
from grpo.modeling.logprobs import fixed_logprobs  # noqa: E402
from grpo.modeling.models import EMBEDDED_MODEL_DIR, load_policy  # noqa: E402
from grpo.rollout.engine import build_engine  # noqa: E402
from grpo.rollout.eos import eos_token_ids  # noqa: E402
from grpo.rollout.params import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
CPU = torch.device("cpu")


def config(**overrides):
    return build_config(None, {"rollout.engine": "vllm", "rollout.vllm.kv_cache_gb": 0.25,
                               "rollout.vllm.max_model_length": 128, **overrides})


@pytest.fixture(scope="module")
def policy():
    return load_policy(EMBEDDED_MODEL_DIR)


@pytest.fixture(scope="module")
def engine(policy):
    model, tok = policy
    eng = build_engine(config(), model, tok, CPU)
    yield eng
    eng.close()


def held_out(tok, n=16):
    rows = arithmetic_rows("test", n, seed=0)
    return tokenize_prompts(tok, rows, CPU)


def params(tok, model, **kw):
    return SamplingParams(**{"n": 1, "temperature": 0.0, "max_tokens": 40,
                             "stop_token_ids": eos_token_ids(tok, model), **kw})


def test_greedy_completions_agree_across_native_transformers_and_vllm(policy, engine):
    model, tok = policy
    batch = held_out(tok)
    got = {}
    for name in ("native", "transformers"):
        other = build_engine(build_config(None, {"rollout.engine": name}), model, tok, CPU)
        got[name] = other.generate(batch.prompt_ids, batch.prompt_mask, params(tok, model))
    got["vllm"] = engine.generate(batch.prompt_ids, batch.prompt_mask, params(tok, model))
    texts = {k: [tok.decode(ids[m.bool()]) for ids, m in zip(g.completion_ids, g.completion_mask)]
             for k, g in got.items()}
    assert texts["native"] == texts["transformers"] == texts["vllm"]
    assert all(t.endswith(tok.eos_token) or "</answer>" in t for t in texts["vllm"])


def test_sampled_groups_repeat_per_prompt_whatever_the_batch(policy, engine):
    """Seeds per prompt group (the run seed and the prompt's global index): the same prompt samples the same
    group alone or in a batch; another run seed samples another."""
    model, tok = policy
    batch = held_out(tok, 6)
    p = params(tok, model, n=4, temperature=1.0, seed=7)
    whole = engine.generate(batch.prompt_ids, batch.prompt_mask, p, prompt_index=torch.arange(10, 16))
    alone = engine.generate(batch.prompt_ids[3:4], batch.prompt_mask[3:4], p, prompt_index=torch.tensor([13]))
    T = alone.completion_ids.size(1)
    assert torch.equal(whole.completion_ids[12:16, :T] * whole.completion_mask[12:16, :T],
                       alone.completion_ids * alone.completion_mask)
    torch.testing.assert_close(whole.sampling_logprobs[12:16, :T], alone.sampling_logprobs)
    other = engine.generate(batch.prompt_ids, batch.prompt_mask, p.with_(seed=8), prompt_index=torch.arange(10, 16))
    assert not torch.equal(other.completion_ids[:, :4], whole.completion_ids[:, :4])
    lp = whole.sampling_logprobs[whole.completion_mask.bool()]
    assert (lp <= 0).all() and (lp < 0).any()


def _sequences(tok, model, engine):
    batch = held_out(tok, 4)
    gen = engine.generate(batch.prompt_ids, batch.prompt_mask, params(tok, model, n=2, temperature=1.0, seed=3))
    input_ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)
    attention = torch.cat([gen.prompt_mask, gen.completion_mask], dim=1)
    return gen, input_ids, attention


def _vllm_logprobs(engine, gen):
    seqs = [p[pm.bool()].tolist() + c[cm.bool()].tolist()
            for p, pm, c, cm in zip(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)]
    start = [int(pm.sum()) for pm in gen.prompt_mask]
    got = torch.zeros(gen.completion_ids.shape)
    for r, lps in enumerate(engine.prompt_logprobs(seqs, start)):
        got[r, :len(lps)] = torch.tensor(lps)
    return got


def test_weight_sync_after_an_update_gives_vllm_the_updated_policy(policy, engine):
    """After one optimizer update and the sync, vLLM's log-probs of fixed completions are the trainer's
    recomputed ones of the updated policy (float32 on both sides), and not the old policy's."""
    model, tok = policy
    gen, input_ids, attention = _sequences(tok, model, engine)
    T, mask = gen.completion_ids.size(1), gen.completion_mask.bool()
    old = fixed_logprobs(model, input_ids, attention, T)
    torch.testing.assert_close(_vllm_logprobs(engine, gen)[mask], old[mask], atol=2e-4, rtol=1e-4)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        from grpo.modeling.logprobs import completion_logprobs
        logp, _ = completion_logprobs(model, input_ids, attention, T)
        (-(logp * gen.completion_mask).sum()).backward()               # one real update: more of these tokens
        opt.step()
        model.eval()
        new = fixed_logprobs(model, input_ids, attention, T)
        assert (new[mask] - old[mask]).abs().max() > 1e-2              # the update moved the policy
        stale = _vllm_logprobs(engine, gen)
        torch.testing.assert_close(stale[mask], old[mask], atol=2e-4, rtol=1e-4)   # no sync, no change
        engine.sync_weights(model)
        synced = _vllm_logprobs(engine, gen)
        torch.testing.assert_close(synced[mask], new[mask], atol=2e-4, rtol=1e-4)
        assert (synced[mask] - old[mask]).abs().max() > 1e-2
    finally:
        model.load_state_dict(saved)
        engine.sync_weights(model)
    torch.testing.assert_close(_vllm_logprobs(engine, gen)[mask], old[mask], atol=2e-4, rtol=1e-4)


def test_sampler_logprobs_are_the_processed_distributions(policy, engine):
    """At temperature 0.7 the engine reports log-probs of the tempered distribution, as grpo's forward with
    the same temperature computes them (what rollout/logprob_diff and the TIS/MIS correction compare)."""
    model, tok = policy
    batch = held_out(tok, 4)
    gen = engine.generate(batch.prompt_ids, batch.prompt_mask, params(tok, model, n=2, temperature=0.7, seed=1))
    input_ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)
    attention = torch.cat([gen.prompt_mask, gen.completion_mask], dim=1)
    mine = fixed_logprobs(model, input_ids, attention, gen.completion_ids.size(1), temperature=0.7)
    mask = gen.completion_mask.bool()
    torch.testing.assert_close(gen.sampling_logprobs[mask], mine[mask], atol=2e-4, rtol=1e-4)


def test_lora_policy_syncs_merged_weights(policy, engine):
    from grpo.config import LoraConfig
    from grpo.modeling.lora import apply_lora

    model, tok = policy
    import copy
    lora = apply_lora(copy.deepcopy(model), LoraConfig(enabled=True, r=4, alpha=8))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)                                       # a trained adapter (B starts at zero)
    gen, input_ids, attention = _sequences(tok, model, engine)
    T, mask = gen.completion_ids.size(1), gen.completion_mask.bool()
    want = fixed_logprobs(lora, input_ids, attention, T)
    assert (want[mask] - fixed_logprobs(model, input_ids, attention, T)[mask]).abs().max() > 1e-2
    try:
        engine.sync_weights(lora)
        torch.testing.assert_close(_vllm_logprobs(engine, gen)[mask], want[mask], atol=2e-4, rtol=1e-4)
    finally:
        engine.sync_weights(model)


def test_a_batch_larger_than_one_step_of_tokens_keeps_its_seeds(policy, engine):
    """50 seeded prompts of 100 tokens (5,000 prompt tokens, over vLLM's 4,096-token step): on the CPU backend a
    chunked prefill would rewind a seeded CPU generator, which vLLM 0.32 cannot; whole prefills keep every
    prompt's seed, and each prompt samples as it does alone."""
    model, tok = policy
    ids = torch.tensor([[4 + (i + j) % 20 for j in range(100)] for i in range(50)])
    p = params(tok, model, n=2, temperature=1.0, max_tokens=8, seed=11)
    many = engine.generate(ids, torch.ones_like(ids), p, prompt_index=torch.arange(50))
    one = engine.generate(ids[37:38], torch.ones_like(ids[37:38]), p, prompt_index=torch.tensor([37]))
    T = one.completion_ids.size(1)
    assert many.completion_ids.shape[0] == 100
    assert torch.equal(many.completion_ids[74:76, :T], one.completion_ids)
