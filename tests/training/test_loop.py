import json

import pytest
import torch

from grpo.config import build_config
from grpo.modeling.models import build_model, build_tokenizer
from grpo.config.presets import PRESETS
from grpo.training.experience import decode_completions, repeat_each
from grpo.api.trainer import train


def run(tmp_path, reward_file, **over):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    flat = {"train.output_dir": str(tmp_path), "train.max_steps": 2, "train.prompts_per_step": 2,
            "rollout.num_generations": 4, "rollout.max_new_tokens": 6, "optim.lr": 1e-2,
            "data.num_train_prompts": 20, "log.progress_bar": False, "train.save_final": False,
            "reward.functions": [f"{reward_file}:digits_reward"], **over}
    result = train(build_config(overrides=flat), model, tok)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return before, result, records


def test_beta_zero_has_no_reference_and_mu_two_reuses_the_batch(tmp_path, monkeypatch):
    reward_file = tmp_path / "r.py"
    reward_file.write_text("def digits_reward(prompts, completions, **kw):\n"
                           "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    import grpo.training.loop as trainer_module

    copies, batches = [], []
    real_build = trainer_module.build_reference
    monkeypatch.setattr(trainer_module, "build_reference", lambda m, beta, dt=None, **kw: copies.append(real_build(m, beta, dt, **kw)) or copies[-1])
    real_update = trainer_module.policy_update
    monkeypatch.setattr(trainer_module, "policy_update", lambda m, o, s, batch, *a, **k: batches.append(batch)
                        or real_update(m, o, s, batch, *a, **k))
    before, result, records = run(tmp_path / "a", reward_file, **{"algorithm.beta": 0.0, "algorithm.num_iterations": 2})
    assert copies == [None]                                  # beta = 0: no reference model built
    assert records[0]["kl/mean"] is None                     # and no KL to report
    assert any(not torch.equal(a, b) for a, b in zip(before, result.model.parameters()))
    assert records[0]["optim/lr"] == 1e-2 and result.checkpoint is None
    # mu = 2: two optimizer steps per generation batch, on the same batch with stored old log-probs
    assert len(batches) == 4 and batches[0] is batches[1] and batches[2] is batches[3]
    assert batches[0].old_logprobs is not None and batches[0].ref_logprobs is None


def test_same_seed_same_metrics(tmp_path):
    reward_file = tmp_path / "r.py"
    reward_file.write_text("def digits_reward(prompts, completions, **kw):\n"
                           "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "rollout/tokens"))}  # noqa: E731
    _, a, ra = run(tmp_path / "a", reward_file)
    _, b, rb = run(tmp_path / "b", reward_file)
    assert [drop(r) for r in ra] == [drop(r) for r in rb]
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


def test_helpers():
    assert repeat_each(["a", "b"], 3) == ["a", "a", "a", "b", "b", "b"]

    class Gen:
        completion_ids = torch.tensor([[5, 6, 1, 0], [7, 7, 7, 7]])
        completion_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])

    tok = build_tokenizer()
    texts = decode_completions(tok, Gen())
    assert texts[0] == tok.decode([5, 6]) and "<|endoftext|>" not in texts[0]
    assert texts[1] == tok.decode([7, 7, 7, 7])


def digits_reward_file(tmp_path):
    reward_file = tmp_path / "r.py"
    reward_file.write_text("def digits_reward(prompts, completions, **kw):\n"
                           "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    return reward_file


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_trains(tmp_path, preset):
    over = {"algorithm.preset": preset, "rollout.num_generations": 4}
    if preset == "gfpo":
        over["algorithm.gfpo_sample_size"] = 6
    before, result, records = run(tmp_path, digits_reward_file(tmp_path), **over)
    assert len(records) == 2 and all(r["optim/skipped_steps"] == 0 for r in records)
    assert any(not torch.equal(a, b) for a, b in zip(before, result.model.parameters()))
    if PRESETS[preset].values.get("algorithm.kl_in") == "reward":
        assert records[0]["kl/reward_penalty_mean"] is not None and records[0]["kl/mean"] is None


def test_reference_offloaded_to_disk_trains_bit_identically(tmp_path, monkeypatch):
    import grpo.training.loop as trainer_module
    refs = []
    real_build = trainer_module.build_reference
    monkeypatch.setattr(trainer_module, "build_reference",
                        lambda m, beta, dt=None, **kw: refs.append(real_build(m, beta, dt, **kw)) or refs[-1])
    reward_file = digits_reward_file(tmp_path)
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "rollout/tokens"))}  # noqa: E731
    _, a, ra = run(tmp_path / "a", reward_file, **{"train.ref_offload": "none"})
    _, b, rb = run(tmp_path / "b", reward_file, **{"train.ref_offload": "disk"})
    assert refs[0].offloaded is None and refs[1].offloaded is not None
    assert all(p.numel() == 0 for p in refs[1].model.parameters())        # still not resident after the run
    assert ra[0]["kl/mean"] is not None and [drop(r) for r in ra] == [drop(r) for r in rb]
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


def test_reference_refresh_follows_the_policy(tmp_path, monkeypatch):
    import grpo.training.loop as trainer_module

    refs = []
    real_build = trainer_module.build_reference
    monkeypatch.setattr(trainer_module, "build_reference", lambda m, beta, dt=None, **kw: refs.append(real_build(m, beta, dt, **kw)) or refs[-1])
    _, result, _ = run(tmp_path, digits_reward_file(tmp_path), **{"algorithm.ref_update_steps": 2,
                                                                   "algorithm.ref_mix_alpha": 1.0})
    # refreshed after step 2 (the last): the reference now equals the trained policy
    assert all(torch.equal(a, b) for a, b in zip(refs[0].model.parameters(), result.model.parameters()))


def test_lora_run_from_a_model_directory_saves_an_adapter_checkpoint(tmp_path):
    tok = build_tokenizer()
    model_dir = tmp_path / "base"
    build_model(tok, "micro", seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    flat = {"model.path": str(model_dir), "lora.enabled": True, "lora.r": 4, "train.output_dir": str(tmp_path / "out"),
            "train.max_steps": 2, "train.save_steps": 1, "train.save_total_limit": 1, "train.prompts_per_step": 2,
            "rollout.num_generations": 4, "rollout.max_new_tokens": 6, "optim.lr": 1e-2,
            "data.num_train_prompts": 20, "log.progress_bar": False,
            "reward.functions": [f"{digits_reward_file(tmp_path)}:digits_reward"]}
    result = train(build_config(overrides=flat))
    assert [p.name for p in (tmp_path / "out").glob("checkpoint-*")] == ["checkpoint-2"]
    assert (result.checkpoint / "adapter_config.json").is_file()
    assert not (result.checkpoint / "model.safetensors").exists()          # the adapter only
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["kl/mean"] is not None                               # reference = adapters disabled


def test_chat_dataset_with_a_reward_model_and_lora_end_to_end(tmp_path):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tok = build_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    model_dir, rm_dir = tmp_path / "policy", tmp_path / "rm"
    build_model(tok, "micro", seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    torch.manual_seed(0)
    rm = Qwen2ForSequenceClassification(Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                                    num_attention_heads=2, num_key_value_heads=1,
                                                    intermediate_size=64, num_labels=1,
                                                    pad_token_id=tok.pad_token_id))
    rm.save_pretrained(rm_dir)
    tok.save_pretrained(rm_dir)
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)})
                              for a in range(6)) + "\n")
    seen = tmp_path / "seen.py"
    seen.write_text("def is_chat(prompts, completions, answer, **kw):\n"
                    "    return [float(isinstance(p, list) and p[-1]['role'] == 'user') for p in prompts]\n")
    flat = {"model.path": str(model_dir), "lora.enabled": True, "lora.r": 2, "data.dataset": str(data),
            "data.column_map": {"messages": "prompt"}, "data.system_prompt": "add",
            "reward.functions": [str(rm_dir), f"{seen}:is_chat"], "train.output_dir": str(tmp_path / "out"),
            "train.max_steps": 1, "train.prompts_per_step": 2, "rollout.num_generations": 3,
            "rollout.max_new_tokens": 4, "log.progress_bar": False}
    result = train(build_config(overrides=flat))
    record = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["reward/is_chat/mean"] == 1.0                  # reward functions got the message lists
    assert record["reward/rm:rm/none_frac"] == 0.0 and record["reward/rm:rm/std"] > 0
    assert (result.checkpoint / "adapter_config.json").is_file()


def test_reward_errors_zero_keeps_training_and_counts(tmp_path):
    flaky = tmp_path / "flaky.py"
    flaky.write_text("def flaky(prompts, completions, **kw):\n"
                     "    return [1.0 / (len(c) % 2) for c in completions]\n")   # odd lengths fail
    _, result, records = run(tmp_path, flaky, **{"reward.functions": [f"{flaky}:flaky"], "reward.reward_errors": "zero"})
    assert len(records) == 2 and all("reward/flaky/errors" in r for r in records)
    assert sum(r["reward/flaky/errors"] for r in records) > 0


def test_reward_errors_raise_names_the_function(tmp_path):
    flaky = tmp_path / "flaky.py"
    flaky.write_text("def flaky(prompts, completions, **kw):\n    raise KeyError('answer')\n")
    with pytest.raises(ValueError, match="reward function 'flaky' raised KeyError"):
        run(tmp_path, flaky, **{"reward.functions": [f"{flaky}:flaky"]})


def test_non_finite_steps_are_skipped_then_stop_the_run_keeping_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    import dataclasses

    import grpo.training.loop as trainer_module
    from grpo.state.checkpoint import list_checkpoints, verify_checkpoint
    from grpo.cli.main import main
    from tests.run_helpers import cli_argv, make_micro_dir, make_reward, records, tiny_config

    calls = []
    real_update = trainer_module.policy_update

    def poisoned(model, opt, sched, batch, *a, **k):   # from step 3 on, NaN advantages -> NaN loss
        calls.append(1)
        if len(calls) >= 3:
            batch = dataclasses.replace(batch, advantages=batch.advantages * float("nan"))
        return real_update(model, opt, sched, batch, *a, **k)

    monkeypatch.setattr(trainer_module, "policy_update", poisoned)
    out = tmp_path / "run"
    flat = tiny_config(make_micro_dir(tmp_path / "micro"), make_reward(tmp_path), out,
                       **{"train.max_bad_steps": 3, "train.save_steps": 1})
    assert main(cli_argv(flat)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: 3 consecutive steps (3-5) had a non-finite loss or gradient norm (train.max_bad_steps=3); "
                   f"stopped without saving; last good checkpoint: {out / 'checkpoint-2'}")
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-1", "checkpoint-2"]   # none of a bad state
    verify_checkpoint(out / "checkpoint-2")
    assert [r["optim/skipped_steps"] for r in records(out)] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert [r["loss/total"] for r in records(out)][2:] == [None, None, None]   # NaN is logged as null


def test_deterministic_mode_reproduces_and_restores_the_global_setting(tmp_path):
    from tests.run_helpers import final_weights, make_micro_dir, make_reward, records, run_in_process, tiny_config

    micro, reward = make_micro_dir(tmp_path / "micro"), make_reward(tmp_path)
    over = {"train.deterministic": True, "train.max_steps": 2}
    a = run_in_process(tiny_config(micro, reward, tmp_path / "a", **over))
    b = run_in_process(tiny_config(micro, reward, tmp_path / "b", **over))
    assert not torch.are_deterministic_algorithms_enabled()
    wa, wb = final_weights(a.checkpoint), final_weights(b.checkpoint)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert records(tmp_path / "a") == records(tmp_path / "b")


def test_rollout_logprob_diff_reports_the_sampler_against_the_training_forward(tmp_path):
    """Generation.sampling_logprobs feed `rollout/logprob_diff`: ~0 in fp32 (the same policy through the
    KV-cached sampler and the training forward), from the update's first pass with mu = 1 and from the
    old-policy pass with mu = 2; null when top-k makes the sampler's distribution another one."""
    from tests.run_helpers import make_micro_dir, make_reward, records, run_in_process, tiny_config

    model_dir, reward = make_micro_dir(tmp_path / "micro"), make_reward(tmp_path)
    for mu in (1, 2):
        out = tmp_path / f"mu{mu}"
        run_in_process(tiny_config(model_dir, reward, out, **{"train.max_steps": 2, "algorithm.num_iterations": mu}))
        gaps = [r["rollout/logprob_diff"] for r in records(out)]
        assert all(g is not None and 0 <= g < 1e-3 for g in gaps), gaps
    out = tmp_path / "topk"
    run_in_process(tiny_config(model_dir, reward, out, **{"train.max_steps": 1, "rollout.top_k": 5}))
    assert records(out)[0]["rollout/logprob_diff"] is None


def test_eval_steps_log_eval_metrics_from_the_eval_dataset(tmp_path):
    """train.eval_steps with data.eval_dataset: every N steps metrics.jsonl holds eval/ metrics (greedy,
    the run's rewards); a dataset run without an eval dataset is refused before anything is written."""
    import json

    import pytest

    from grpo.config import ConfigError
    from tests.run_helpers import make_micro_dir, make_reward, records, run_in_process, tiny_config

    model_dir, reward = make_micro_dir(tmp_path / "micro"), make_reward(tmp_path)
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"{a}+2=", "answer": str(a + 2)}) + "\n" for a in range(5)))
    out = tmp_path / "run"
    run_in_process(tiny_config(model_dir, reward, out, **{"train.max_steps": 4, "train.eval_steps": 2,
                                                          "data.eval_dataset": str(held)}))
    rows = records(out)
    name = reward.rsplit(":", 1)[1]
    assert [("eval/pass@1" in r) for r in rows] == [False, True, False, True]
    assert 0.0 <= rows[1]["eval/pass@1"] <= 1.0 and f"eval/reward/{name}" in rows[1]
    assert 0 < rows[1]["eval/completion_length"] <= 6
    data = tmp_path / "train.jsonl"
    data.write_text(held.read_text())
    out2 = tmp_path / "run2"
    with pytest.raises(ConfigError, match="train.eval_steps needs data.eval_dataset"):
        run_in_process(tiny_config(model_dir, reward, out2, **{"train.eval_steps": 2, "data.dataset": str(data)}))
    assert not out2.exists() or not any(out2.iterdir())


def test_gradients_are_freed_after_each_update_and_the_rollout_runs_without_them(tmp_path, monkeypatch):
    """The loop drops .grad after every optimizer update (grpo.training.loop.update), so the next rollout and
    reference pass do not hold a gradient's worth of memory (the planner counts gradients in the update only)."""
    reward_file = tmp_path / "r.py"
    reward_file.write_text("def digits_reward(prompts, completions, **kw):\n"
                           "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    import grpo.training.experience as experience
    import grpo.training.loop as trainer_module

    seen = {"sample": [], "in_update": [], "grad_buffer": []}
    import grpo.rollout.engines.native as native

    real_sample, real_update = native.sample, trainer_module.policy_update

    def sample(model, *a, **k):
        seen["sample"].append(sum(p.grad is not None for p in model.parameters()))
        seen["in_update"].append("sample")
        return real_sample(model, *a, **k)

    def update(model, optimizer, scheduler, batch, algo, settings):
        seen["grad_buffer"].append(settings.grad_buffer)
        stats = real_update(model, optimizer, scheduler, batch, algo, settings)
        seen["in_update"].append(sum(p.grad is not None for p in model.parameters()))
        return stats

    monkeypatch.setattr(native, "sample", sample)
    monkeypatch.setattr(trainer_module, "policy_update", update)
    from grpo.cpu import heap                              # cpu.malloc_trim: once per step, before the update

    def trim():
        seen["in_update"].append("trim")
        return True

    monkeypatch.setattr(heap, "release_free_heap", trim)
    events = []
    from grpo import events as ev
    listener = lambda point, step: point == "update" and events.append(step)
    ev.add_listener(listener)
    try:
        _, result, _ = run(tmp_path / "a", reward_file, **{"train.max_steps": 3})
    finally:
        ev.remove_listener(listener)
    n = sum(1 for p in result.model.parameters() if p.requires_grad)
    assert seen["in_update"] == ["sample", "trim", n] * 3   # rollout, one trim, then the update made every gradient
    assert seen["sample"] == [0, 0, 0]                 # the rollouts after it saw none
    assert seen["grad_buffer"] == [True] * 3           # cpu.grad_buffer: the CPU runtime's plan, one process
    assert events == [1, 2, 3] and all(p.grad is None for p in result.model.parameters())


def test_num_train_epochs_sets_the_step_count_from_the_training_set(tmp_path):
    """train.num_train_epochs: 1.5 passes over 5 prompts at 2 per step = ceil(1.5 * ceil(5 / 2)) = 5 steps, the
    LR schedule built for them, and config.yaml records the resolved max_steps (so a resume agrees)."""
    import yaml

    reward_file = tmp_path / "r.py"
    reward_file.write_text("def digits_reward(prompts, completions, **kw):\n"
                           "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    _, result, records = run(tmp_path / "a", reward_file, **{
        "train.num_train_epochs": 1.5, "data.num_train_prompts": 5, "optim.lr_scheduler": "linear",
        "optim.lr": 1e-3, "rollout.num_generations": 2})
    assert result.steps == 5 and [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert records[-1]["optim/lr"] == pytest.approx(1e-3 * 1 / 5)        # linear decay over 5 steps, not 2
    saved = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert saved["train"]["max_steps"] == 5 and saved["train"]["num_train_epochs"] == 1.5


def test_steps_for_epochs_and_its_check():
    from grpo.config.build import steps_for_epochs

    assert steps_for_epochs(1, 5, 2) == 3 and steps_for_epochs(3, 8, 8) == 3 and steps_for_epochs(0.5, 10, 2) == 3
    assert steps_for_epochs(0.01, 4, 8) == 1                             # at least one step
    with pytest.raises(Exception, match="train.num_train_epochs must be >= 0"):
        build_config(overrides={"train.num_train_epochs": -1})


def test_a_run_that_fails_before_writing_leaves_no_directory(tmp_path):
    """A bad dataset row stops the run before any write: the output directory it created is removed again;
    a directory that existed before is kept."""
    from grpo.data.datasets_io import DataError

    reward_file = tmp_path / "r.py"
    reward_file.write_text("def digits_reward(prompts, completions, **kw):\n    return [1.0 for _ in completions]\n")
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "1+1="}\n{"question": "no prompt column"}\n')
    for out, existed in ((tmp_path / "new" / "run", False), (tmp_path / "old", True)):
        if existed:
            out.mkdir()
        with pytest.raises(DataError):
            run(out, reward_file, **{"data.dataset": str(data)})
        assert out.exists() == existed and (not existed or not any(out.iterdir()))
