"""grpo/envs: tool-call parsers, safe tool execution, the episode driver (turn cap, errors, async environments)."""

from __future__ import annotations

import asyncio
import time

import pytest

from grpo.envs import CalculatorEnv, ToolCall, ToolCallError, ToolEnv, calc, load_env, run_tool, tool_schema
from grpo.envs.agent import EpisodeDriver
from grpo.envs.parsers import call_body, ends_with_call, load_parser, parse_call, parse_qwen
from grpo.modeling.models import TOOL_TAG_TOKENS, build_tokenizer

TOK = build_tokenizer(extra_tags=TOOL_TAG_TOKENS)
FORMAT = "<tool_response>{}</tool_response>"


def test_parsers_read_both_formats_and_explain_failures():
    text = 'ok <tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'
    assert ends_with_call(text) and not ends_with_call(text + "x")
    assert parse_qwen(call_body(text)) == ToolCall("calc", {"expression": "2+3"}, (), call_body(text))
    assert parse_call("calc(347*29+128)").positional == ("347*29+128",)
    assert parse_call("now()").positional == ()
    for bad, parser, message in [("{not json", parse_qwen, "not valid JSON"), ('{"arguments": {}}', parse_qwen, "name"),
                                 ('{"name": "f", "arguments": [1]}', parse_qwen, "not a JSON object"),
                                 ("calc 2+3", parse_call, "name\\(argument\\)")]:
        with pytest.raises(ToolCallError, match=message):
            parser(bad)
    with pytest.raises(ValueError, match="rollout.tool_parser: unknown parser 'xml'"):
        load_parser("xml")


def test_calculator_is_exact_and_safe():
    assert calc("347*29+128") == "10191" and calc("7/2") == "3.5" and calc("-(3-5)*4") == "8"
    with pytest.raises(ValueError, match="only numbers"):
        calc("__import__('os').system('true')")
    schema = tool_schema(calc)["function"]
    assert schema["name"] == "calc" and schema["parameters"]["properties"]["expression"]["type"] == "string"


def hang(x: str) -> str:
    """Never returns.

    Args:
        x: ignored
    """
    time.sleep(3600)
    return x


def boom(x: str) -> str:
    """Raises.

    Args:
        x: ignored
    """
    raise RuntimeError("disk on fire")


def huge(x: str) -> str:
    """A huge output.

    Args:
        x: ignored
    """
    return "9" * 100_000


def opaque(x: str) -> object:
    """Not text.

    Args:
        x: ignored
    """
    return object()


def test_a_tool_that_raises_hangs_floods_or_returns_junk_is_an_error_observation():
    tools = {f.__name__: f for f in (hang, boom, huge, opaque, calc)}
    call = lambda name: ToolCall(name, {}, ("1",))  # noqa: E731
    r = run_tool(tools, call("boom"), timeout_s=1.0, max_chars=64)
    assert r.error and r.text == "error: boom raised RuntimeError: disk on fire"
    start = time.perf_counter()
    r = run_tool(tools, call("hang"), timeout_s=0.2, max_chars=64)
    assert r.error and r.timed_out and time.perf_counter() - start < 2 and "0.2 s" in r.text
    r = run_tool(tools, call("huge"), timeout_s=1.0, max_chars=64)
    assert not r.error and r.text == "9" * 64 + "... [cut at 64 characters]"
    r = run_tool(tools, call("opaque"), timeout_s=1.0, max_chars=64)
    assert r.error and "not text nor JSON" in r.text
    assert run_tool(tools, ToolCall("nope"), 1.0, 64).text.startswith("error: unknown tool 'nope'")


def feed(driver: EpisodeDriver, row: int, text: str) -> list:
    """Feed `text` token by token as if the model wrote it; the driver's answers."""
    out = []
    for t in TOK(text, add_special_tokens=False)["input_ids"]:
        out.append(driver.after_token(row, t))
    return out


def driver_for(envs, max_turns=2, timeout_s=1.0):
    return EpisodeDriver(TOK, envs, parse_call, max_turns=max_turns, observation_format=FORMAT, timeout_s=timeout_s,
                         max_chars=64)


def test_the_driver_answers_a_tool_call_with_observation_tokens():
    d = driver_for([CalculatorEnv()])
    answers = feed(d, 0, "<tool_call>calc(347*29+128)</tool_call>")
    assert answers[:-1] == [([], False)] * (len(answers) - 1)                 # nothing until the call closes
    obs, done = answers[-1]
    assert not done and TOK.decode(obs) == "<tool_response>10191</tool_response>"
    feed(d, 0, "<answer>10191</answer>")
    d.finish(0, True)
    assert d.messages[0] == [{"role": "assistant", "content": "<tool_call>calc(347*29+128)</tool_call>"},
                             {"role": "tool", "content": "10191"},
                             {"role": "assistant", "content": "<answer>10191</answer>"}]
    assert d.metrics()["tools/calls_per_episode"] == 1.0 and d.metrics()["tools/errors"] == 0.0


def test_turn_cap_parse_errors_and_tool_errors_are_counted():
    d = driver_for([CalculatorEnv(), CalculatorEnv()], max_turns=2)
    assert TOK.decode(feed(d, 0, "<tool_call>calc 1</tool_call>")[-1][0]).startswith("<tool_response>error: tool call")
    assert not feed(d, 0, "<tool_call>calc(1/0)</tool_call>")[-1][1]
    assert d.messages[0][-1] == {"role": "tool", "content": "error: calc raised ZeroDivisionError: division by zero"}
    assert feed(d, 0, "<tool_call>calc(1+1)</tool_call>")[-1] == ([], True)      # the third call: over the cap
    m = d.metrics()
    assert (m["tools/parse_errors"], m["tools/errors"], m["tools/calls_per_episode"]) == (1.0, 2.0, 0.5)


class AsyncEnv:
    """An async environment that pays a turn reward and ends the episode on its second call."""

    tools = []

    def __init__(self):
        self.calls = 0

    def reset(self, row):
        return None

    async def step(self, action):
        await asyncio.sleep(0)
        if isinstance(action, str):
            return "", True, {"reward": 1.0 if "42" in action else 0.0}
        self.calls += 1
        return f"call {self.calls}", self.calls >= 2, {"reward": 0.5}


class Stuck(ToolEnv):
    def step(self, action):
        time.sleep(3600)


def test_async_environments_turn_rewards_and_a_stuck_environment():
    factory = load_env(AsyncEnv)
    d = driver_for([factory.make()])
    obs, done = feed(d, 0, "<tool_call>f(x)</tool_call>")[-1]
    assert TOK.decode(obs) == "<tool_response>call 1</tool_response>" and not done
    assert feed(d, 0, "<tool_call>f(y)</tool_call>")[-1] == ([], True)
    d.finish(0, False)
    assert d.turn_rewards[0] == [0.5, 0.5]
    d = driver_for([load_env(Stuck).make()], timeout_s=0.2)
    obs, done = feed(d, 0, "<tool_call>f(x)</tool_call>")[-1]
    assert TOK.decode(obs) == "<tool_response>error: the environment did not answer within 0.2 s</tool_response>"
    assert d.metrics()["tools/timeouts"] == 1.0


def test_environment_specs_and_their_errors(tmp_path):
    assert isinstance(load_env("calculator").make(), CalculatorEnv)
    one = load_env(CalculatorEnv())
    assert one.make() is not one.make()                                         # an object is copied per episode
    f = tmp_path / "my_env.py"
    f.write_text("class Env:\n    tools = []\n    def reset(self, row):\n        return None\n"
                 "    def step(self, action):\n        return '', True, {}\n")
    assert load_env(f"{f}:Env").make().step("x") == ("", True, {})
    with pytest.raises(ValueError, match="rollout.env: unknown environment 'shell'"):
        load_env("shell")
    with pytest.raises(TypeError, match="environment int has no reset"):
        load_env(3)


def test_the_driver_parses_special_tool_call_tags_and_keeps_them_in_the_messages():
    """A tokenizer whose <tool_call> tags are special tokens (and with an end-of-turn <|im_end|> listed as an
    EOS): the parser still reads the call in the raw text, the messages keep the tags but no other special
    token (as TRL's skip_special_tokens=True text), and no EOS id reaches any text."""
    from tokenizers import AddedToken

    from grpo.modeling.models import build_tokenizer

    tok = build_tokenizer()
    tags = ("<tool_call>", "</tool_call>", "<|im_end|>")
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in tags], special_tokens=True)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    d = EpisodeDriver(tok, [CalculatorEnv()], parse_call, max_turns=2, observation_format="{}", timeout_s=1.0,
                      max_chars=64, eos_token_ids=(tok.eos_token_id, im_end))
    ids = tok("a<|unk|><tool_call>calc(2+3)</tool_call>", add_special_tokens=False)["input_ids"]
    answers = [d.after_token(0, t) for t in ids]
    assert tok.decode(answers[-1][0]) == "5" and not answers[-1][1]
    for t in tok("<answer>5</answer>", add_special_tokens=False)["input_ids"] + [im_end]:
        d.after_token(0, t)
    d.finish(0, True)
    assert d.messages[0] == [{"role": "assistant", "content": "a<tool_call>calc(2+3)</tool_call>"},
                             {"role": "tool", "content": "5"},
                             {"role": "assistant", "content": "<answer>5</answer>"}]
