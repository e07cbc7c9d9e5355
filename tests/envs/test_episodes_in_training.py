"""Multi-turn episodes inside a real GRPO run (grpo.Trainer with env=...): tools that misbehave are contained and
counted, the run goes on; metrics and samples carry the episodes."""

from __future__ import annotations

import itertools
import json
import time

import pytest
import torch

from grpo.api.trainer import Trainer
from grpo.envs import ToolEnv
from grpo.modeling.models import TOOL_TAG_TOKENS, build_model, build_tokenizer


def sleepy(x: str = "") -> str:
    """Sleeps forever.

    Args:
        x: ignored
    """
    time.sleep(3600)
    return x


def broken(x: str = "") -> str:
    """Raises.

    Args:
        x: ignored
    """
    raise OSError("network unreachable")


def flood(x: str = "") -> str:
    """A huge output.

    Args:
        x: ignored
    """
    return "7" * 1_000_000


CYCLE = itertools.cycle(["sleepy", "broken", "flood"])


def every_call_is_a_bad_tool(body: str):
    """A parser (rollout.tool_parser as a function) that turns any <tool_call> into a call of the next bad tool."""
    return next(CYCLE), {}


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """The micro model with the tool-use tokenizer: untrained, it closes a <tool_call> now and then."""
    d = tmp_path_factory.mktemp("tool-model")
    tok = build_tokenizer(extra_tags=TOOL_TAG_TOKENS)
    build_model(tok, "micro", seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def run(tool_model, out, env, parser, steps=2, **over):
    rows = [{"prompt": f"{a}*{b}+1=", "answer": str(a * b + 1)} for a, b in [(12, 3), (45, 6), (7, 89), (10, 11)]]
    flat = {"rollout.num_generations": 4, "rollout.max_new_tokens": 40, "rollout.tool_parser": parser,
            "rollout.tool_timeout_s": 0.2, "rollout.max_observation_chars": 32, "train.prompts_per_step": 2,
            "train.max_steps": steps, "cpu.num_threads": 1, "train.output_dir": str(out), "log.progress_bar": False,
            "optim.lr": 1e-3, "train.save_final": False, **over}
    return Trainer(str(tool_model), reward_funcs=["exact_match"], train_dataset=rows, config=flat, env=env).train()


@pytest.mark.slow
def test_tools_that_hang_raise_or_flood_are_contained_and_the_run_goes_on(tool_model, tmp_path, monkeypatch):
    parser_file = tmp_path / "parser.py"
    parser_file.write_text("import itertools\nC = itertools.cycle(['sleepy', 'broken', 'flood'])\n"
                           "def parse(body):\n    return next(C), {}\n")
    env = ToolEnv([sleepy, broken, flood])
    start = time.perf_counter()
    result = run(tool_model, tmp_path / "run", env, f"{parser_file}:parse", steps=3, **{"rollout.max_turns": 6})
    assert result.steps == 3 and time.perf_counter() - start < 300
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    calls = sum(r["tools/calls_per_episode"] for r in records)
    assert calls > 0, "the untrained model closed no tool call: pick another seed"
    assert sum(r["tools/errors"] for r in records) > 0 and sum(r["tools/timeouts"] for r in records) > 0
    samples = (tmp_path / "run" / "samples.jsonl").read_text()
    assert "7" * 40 not in samples                                           # floods are cut to 32 characters


def test_a_run_with_the_calculator_environment_logs_its_episodes(tool_model, tmp_path):
    result = run(tool_model, tmp_path / "calc", "calculator", "call")
    assert result.steps == 2
    rec = result.metrics
    assert {"tools/calls_per_episode", "tools/use_rate", "tools/errors", "tools/timeouts", "env/turns_mean"} <= set(rec)
    assert rec["env/turns_mean"] >= 1.0


def test_turn_ids_by_hand():
    from grpo.envs.episodes import turn_ids

    action = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 1, 1, 1, 1, 1, 1]])
    assert turn_ids(action).tolist() == [[0, 0, -1, -1, 1, 1, -1, 2, -1, -1], [0, -1, 1, -1, 2, 2, 2, 2, 2, 2]]


class PayingEnv(ToolEnv):
    """Pays 1.0 for every tool call (a per-turn reward in info)."""

    def step(self, action):
        if isinstance(action, str):
            return "", True, {}
        return "ok", False, {"reward": 1.0}


def turn_sum(completions, turn_rewards, **kwargs):
    """TRL-style: the per-turn rewards of each episode arrive as a column."""
    return [float(sum(t)) for t in turn_rewards]


def test_turn_rewards_reach_rewards_and_the_process_advantages(tool_model, tmp_path):
    parser_file = tmp_path / "parser.py"
    parser_file.write_text("def parse(body):\n    return 'anything', {}\n")
    rows = [{"prompt": f"{a}*{b}+1=", "answer": str(a * b + 1)} for a, b in [(12, 3), (45, 6)]]
    flat = {"rollout.num_generations": 4, "rollout.max_new_tokens": 40, "rollout.tool_parser": f"{parser_file}:parse",
            "train.prompts_per_step": 2, "train.max_steps": 2, "cpu.num_threads": 1, "log.progress_bar": False,
            "train.output_dir": str(tmp_path / "run"), "train.save_final": False, "optim.lr": 1e-3}
    result = Trainer(str(tool_model), reward_funcs=[turn_sum], train_dataset=rows, config=flat, env=PayingEnv).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    calls = [r["tools/calls_per_episode"] for r in records]
    assert result.steps == 2 and sum(calls) > 0
    assert [r["reward/turn_sum/mean"] for r in records] == pytest.approx(calls)   # one 1.0 per answered call


def test_tools_argument_is_a_tool_env_of_those_functions(tool_model, tmp_path):
    """TRL's tools=[fn, ...]: the same episodes as env=ToolEnv([fn, ...]); env= and tools= together is an error."""
    from grpo.envs.tools import BUILTIN_TOOLS

    rows = [{"prompt": "12*3+1=", "answer": "37"}]
    flat = {"train.output_dir": str(tmp_path / "t"), "rollout.tool_parser": "call"}
    trainer = Trainer(str(tool_model), reward_funcs=["exact_match"], train_dataset=rows, config=flat,
                      tools=[BUILTIN_TOOLS["calc"]])
    env = trainer.env.make()
    assert isinstance(env, ToolEnv) and [t.__name__ for t in env.tools] == ["calc"]
    assert [t.__name__ for t in trainer.env.tools] == ["calc"]             # their schemas reach the template
    rec = Trainer(str(tool_model), reward_funcs=["exact_match"], train_dataset=rows, tools=[BUILTIN_TOOLS["calc"]],
                  config={**flat, "train.max_steps": 1, "rollout.num_generations": 4, "rollout.max_new_tokens": 40,
                          "train.prompts_per_step": 1, "log.progress_bar": False, "train.save_final": False}
                  ).train().metrics
    assert {"tools/calls_per_episode", "env/turns_mean"} <= set(rec) and rec["env/turns_mean"] >= 1.0
    with pytest.raises(TypeError, match="give env= or tools="):
        Trainer(str(tool_model), reward_funcs=["exact_match"], train_dataset=rows, config=flat, env="calculator",
                tools=[BUILTIN_TOOLS["calc"]])
