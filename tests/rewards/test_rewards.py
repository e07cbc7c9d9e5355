import asyncio
import math
import sys

import numpy as np
import pytest
import torch

from grpo.rewards import RewardError, load_reward, score
from grpo.rewards.builtin import accuracy_reward as arithmetic_accuracy, format_reward


def test_builtin_accuracy_and_format():
    comps = ["<think>1+2=3</think><answer>3</answer>", "<think></think><answer>4</answer>", "no tags 3"]
    assert arithmetic_accuracy(["p"] * 3, comps, answer=["3", "3", "3"]) == [1.0, 0.0, 0.0]
    assert format_reward(["p"] * 3, comps) == [1.0, 1.0, 0.0]
    assert arithmetic_accuracy(["p"], ["x"]) == [None]  # no answer column: does not apply


def test_weighted_sum_with_none_and_per_function_columns():
    def half(prompts, completions, **kw):
        return [0.5, None, 1.0]

    def const(prompts, completions, **kw):
        return [1.0, 2.0, None]

    s = score([("half", half), ("const", const)], [2.0, 1.0], ["p"] * 3, ["a", "b", "c"], {})
    assert s.names == ["half", "const"]
    assert torch.allclose(s.total, torch.tensor([2.0, 2.0, 2.0]))   # 2*0.5+1, 0+2, 2*1+0
    assert math.isnan(s.per_function[1, 0]) and math.isnan(s.per_function[2, 1])


def test_columns_are_passed_by_name():
    seen = {}

    def fn(prompts, completions, answer, level):
        seen.update(answer=answer, level=level)
        return [0.0] * len(completions)

    score([("fn", fn)], None, ["p", "q"], ["a", "b"], {"answer": ["1", "2"], "level": [3, 4]})
    assert seen == {"answer": ["1", "2"], "level": [3, 4]}


def test_async_reward():
    async def fn(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    assert score([("fn", fn)], None, ["p"], ["abc"], {}).total.tolist() == [3.0]


# Reward functions with TRL's exact signatures: they work only when called by keyword.
HINT = ("reward functions are called by keyword as in TRL: fn(prompts=, completions=, completion_ids=, **columns); "
        "add **kwargs")


def accuracy_reward(completions, solution, **kwargs):
    return [float(c.strip() == s) for c, s in zip(completions, solution)]


def fmt(completions, **kw):
    return [0.5 if c.startswith("<") else 0.0 for c in completions]


def inverse_length(completion_ids, **kwargs):
    return [1.0 / len(ids) for ids in completion_ids]


async def judge(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [float(p in c) for p, c in zip(prompts, completions)]


def test_trl_signatures_are_called_by_keyword():
    fns = [("acc", accuracy_reward), ("fmt", fmt), ("short", inverse_length), ("judge", judge)]
    s = score(fns, None, ["2+2", "3+3"], ["4", "<b> 3+3 6"],
              {"solution": ["4", "7"], "completion_ids": [[5, 6], [1, 2, 3, 4]], "level": [1, 2]})
    # acc 1, 0; fmt 0, 0.5; short 1/2, 1/4; judge: "2+2" not in "4" -> 0, "3+3" in "<b> 3+3 6" -> 1
    assert s.per_function.tolist() == [[1.0, 0.0, 0.5, 0.0], [0.0, 0.5, 0.25, 1.0]]
    assert s.total.tolist() == [1.5, 1.75]


def first_message_length(completions, **kwargs):
    return [float(len(completion[0]["content"])) for completion in completions]


def test_conversational_completions_reach_the_function_as_messages():
    prompts = [[{"role": "user", "content": "hi"}]] * 2
    completions = [[{"role": "assistant", "content": "abc"}], [{"role": "assistant", "content": "de"}]]
    assert score([("n", first_message_length)], None, prompts, completions, {}).total.tolist() == [3.0, 2.0]


def strict(completions, solution):          # no **kwargs: the other keywords do not fit
    return [1.0] * len(completions)


def needs_answer(completions, answer, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("on_error", ["raise", "zero"])
@pytest.mark.parametrize("fn,problem", [
    (strict, "got an unexpected keyword argument 'prompts' (called with prompts, completions, solution)"),
    (needs_answer, "missing a required argument: 'answer' (called with prompts, completions, solution)"),
])
def test_a_function_that_cannot_take_its_arguments_is_a_one_line_error(on_error, fn, problem):
    with pytest.raises(RewardError) as info:       # in both modes: it would fail on every batch
        score([(fn.__name__, fn)], None, ["p", "q"], ["a", "b"], {"solution": ["1", "2"]}, on_error=on_error)
    assert (str(info.value), info.value.index) == (f"reward function '{fn.__name__}' cannot take its arguments: "
                                                   f"{problem}; {HINT}", None)


def old_style(prompts, completions, **kw):
    return [1.0] * len(completions)


def positional_wrapper(*args, **kwargs):           # e.g. a decorator passing prompts on positionally
    return old_style(kwargs["prompts"], **kwargs)


def test_a_call_error_inside_the_function_gets_the_hint():
    with pytest.raises(RewardError) as info:
        score([("w", positional_wrapper)], None, ["p", "q"], ["a", "b"], {})
    assert str(info.value) == ("reward function 'w' raised TypeError: old_style() got multiple values for argument "
                               f"'prompts' for completion 0 ('a'); {HINT} (and 1 more completions)")


def test_a_column_named_like_an_argument_is_an_error():
    with pytest.raises(RewardError, match="a column is named 'completions', like a reward function argument"):
        score([("fmt", fmt)], None, ["p"], ["a"], {"completions": ["x"]})
    for name in ("trainer_state", "log_metric", "log_extra"):                  # TRL's keywords, passed by us
        with pytest.raises(RewardError, match=f"a column is named '{name}', like a reward function argument"):
            score([("fmt", fmt)], None, ["p"], ["a"], {name: ["x"]})


def test_step_rewards_are_called_by_keyword_on_the_completion_text():
    from grpo.rewards.process import score_steps

    def step_lengths(steps, completions, **kwargs):     # TRL style: only the arguments it needs
        assert completions[0] == [{"role": "assistant", "content": "ab\nc"}]
        return [[float(len(s)) for s in st] for st in steps]

    prompts = [[{"role": "user", "content": "q"}]]
    out = score_steps([("n", step_lengths)], prompts, [[{"role": "assistant", "content": "ab\nc"}]], {}, "\n")
    assert out == [[3.0, 1.0]]                           # steps "ab\n" and "c"


@pytest.mark.parametrize("ret,message", [
    ([float("inf")], "returned inf"), ([float("-inf")], "returned -inf"), (["1"], "expected a finite number"),
    ([1.0, 2.0], "one value per completion"),
])
def test_bad_reward_values_name_the_function(ret, message):
    def bad(prompts, completions, **kw):
        return ret

    with pytest.raises(RewardError, match=f"'bad'.*{message}|{message}"):
        score([("bad", bad)], None, ["p"], ["c"], {})


def test_raising_reward_names_the_function():
    def boom(prompts, completions, **kw):
        raise KeyError("x")

    with pytest.raises(RewardError, match="reward function 'boom' raised KeyError"):
        score([("boom", boom)], None, ["p"], ["c"], {})


def test_load_reward_from_file(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text("def short(prompts, completions, **kw):\n    return [1.0 / (1 + len(c)) for c in completions]\n")
    name, fn = load_reward(f"{f}:short")
    assert name == "short" and fn(["p"], ["abc"]) == [0.25]
    with pytest.raises(RewardError, match="has no function 'nope'"):
        load_reward(f"{f}:nope")
    (tmp_path / "broken.py").write_text("import not_a_module_xyz\n")
    with pytest.raises(RewardError, match="broken.py failed to import: ModuleNotFoundError"):
        load_reward(f"{tmp_path / 'broken.py'}:f")
    with pytest.raises(RewardError, match="unknown reward 'accuracyy'"):
        load_reward("accuracyy")
    assert load_reward("accuracy")[1] is arithmetic_accuracy


@pytest.mark.parametrize("nan", [float("nan"), np.float32("nan"), torch.tensor(float("nan")).item()])
def test_nan_reward_counts_as_none(nan):
    """TRL turns None into NaN and takes nan-aware means (grpo_trainer.py _calculate_rewards and the group
    baseline), so a NaN row is "does not apply", not an error: the total is the other functions' weighted sum."""
    def a(completions, **kw):
        return [1.0, nan, nan]

    def b(completions, **kw):
        return [2.0, 3.0, None]

    for on_error in ("raise", "zero"):
        s = score([("a", a), ("b", b)], [1.0, 0.5], ["p"] * 3, ["x", "y", "z"], {}, on_error=on_error)
        assert s.per_function.flatten().tolist() == pytest.approx([1.0, 2.0, math.nan, 3.0, math.nan, math.nan],
                                                                  nan_ok=True)
        # row 0: 1*1 + 0.5*2 = 2; row 1: only b applies, 0.5*3 = 1.5; row 2: nothing applies -> NaN
        assert s.total.tolist() == pytest.approx([2.0, 1.5, math.nan], nan_ok=True)
        assert s.errors == {"a": 0, "b": 0}


def test_all_none_rows_get_nan_total():
    def maybe(prompts, completions, **kw):
        return [None, 1.0]

    def never(prompts, completions, **kw):
        return [None, None]

    s = score([("maybe", maybe), ("never", never)], [2.0, 1.0], ["p"] * 2, ["a", "b"], {})
    assert math.isnan(s.total[0]) and s.total[1] == 2.0
    assert s.errors == {"maybe": 0, "never": 0}


def test_async_rewards_run_concurrently():
    state = {"running": 0, "peak": 0}

    async def tracked(prompts, completions, **kw):
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
        await asyncio.sleep(0.05)
        state["running"] -= 1
        return [1.0] * len(completions)

    def plain(prompts, completions, **kw):
        return [0.5] * len(completions)

    s = score([("a", tracked), ("plain", plain), ("b", tracked), ("c", tracked)], None, ["p"], ["x"], {})
    assert state["peak"] == 3 and s.total.tolist() == [3.5]


def test_async_rewards_inside_a_running_event_loop():
    async def fn(prompts, completions, **kw):
        return [2.0] * len(completions)

    async def caller():  # e.g. a notebook: score() is called while a loop runs
        return score([("fn", fn)], None, ["p"], ["x"], {})

    assert asyncio.run(caller()).total.tolist() == [2.0]


def fails_on_bad(prompts, completions, **kw):
    return [1 / 0 if "bad" in c else 1.0 for c in completions]


def fails_on_batches(prompts, completions, **kw):
    if len(completions) > 1:
        raise RuntimeError("batch too large")
    return [1.0]


async def async_fails_on_bad(prompts, completions, **kw):
    return fails_on_bad(prompts, completions)


@pytest.mark.parametrize("fn,index,message", [
    (fails_on_bad, 1, "reward function 'f' raised ZeroDivisionError: division by zero for completion 1 "
                      "('a bad one') (and 1 more completions)"),
    (async_fails_on_bad, 1, "reward function 'f' raised ZeroDivisionError: division by zero for completion 1 "
                            "('a bad one') (and 1 more completions)"),
    (fails_on_batches, None, "reward function 'f' raised RuntimeError: batch too large on the batch of 3 "
                             "completions, but no single completion fails alone"),
    (lambda **kw: [1.0, float("inf"), 1.0], 1, "reward function 'f' returned inf: expected a finite number, "
                                                     "NaN or None for completion 1 ('a bad one')"),
    (lambda **kw: [1.0, 1.0, float("-inf")], 2, "reward function 'f' returned -inf: expected a finite number, "
                                                      "NaN or None for completion 2 ('bad too')"),
    (lambda **kw: [1.0, "2", 1.0], 1, "reward function 'f' returned '2': expected a finite number, NaN or None "
                                            "for completion 1 ('a bad one')"),
    (lambda **kw: [1.0], None, "reward function 'f' must return one value per completion (3), got 1"),
    (lambda **kw: None, None, "reward function 'f' must return a list of one value per completion (3), got None"),
])
def test_errors_name_the_function_and_the_completion(fn, index, message):
    with pytest.raises(RewardError) as info:
        score([("ok", lambda **kw: [0.0] * len(kw["completions"])), ("f", fn)], None, ["p"] * 3,
              ["good", "a bad one", "bad too"], {})
    assert (str(info.value), info.value.index) == (message, index)


@pytest.mark.parametrize("fn,values,errors", [
    (fails_on_bad, [1.0, 0.0, 0.0], 2),                                   # failing completions -> 0, others kept
    (async_fails_on_bad, [1.0, 0.0, 0.0], 2),
    (fails_on_batches, [0.0, 0.0, 0.0], 3),                               # a batch-level failure zeroes the batch
    (lambda **kw: [None, float("inf"), 0.5], [math.nan, 0.0, 0.5], 1),
    (lambda **kw: [1.0], [0.0, 0.0, 0.0], 3),
])
def test_reward_errors_zero(fn, values, errors):
    s = score([("ok", lambda **kw: [1.0] * len(kw["completions"])), ("f", fn)], None, ["p"] * 3,
              ["good", "a bad one", "bad too"], {}, on_error="zero")
    assert s.per_function[:, 1].tolist() == pytest.approx(values, nan_ok=True)
    assert s.errors == {"ok": 0, "f": errors}


def test_error_excerpt_is_short_and_on_one_line():
    def boom(prompts, completions, **kw):
        raise ValueError("first line\nsecond line")

    with pytest.raises(RewardError) as info:
        score([("boom", boom)], None, ["p"], ["x" * 100 + "\nmore"], {})
    assert str(info.value) == f"reward function 'boom' raised ValueError: first line for completion 0 ('{'x' * 57}...')"


def test_unknown_error_mode():
    with pytest.raises(RewardError, match="reward_errors must be one of raise | zero"):
        score([], None, [], [], {}, on_error="ignore")


def test_step_reward_call_names_the_completion():
    from grpo.rewards import _call

    def steps(prompts, completions, steps, **kw):
        return [[len(s) for s in st] if "x" not in c else 1 / 0 for c, st in zip(completions, steps)]

    assert _call("steps", steps, ["p"], ["ab"], {"steps": [["a", "b"]]}) == [[1, 1]]
    with pytest.raises(RewardError, match="'steps' raised ZeroDivisionError: division by zero for completion 1 \\('x'\\)"):
        _call("steps", steps, ["p", "q"], ["ab", "x"], {"steps": [["a"], ["x"]]})


def test_load_async_reward_from_file(tmp_path):
    f = tmp_path / "remote.py"
    f.write_text("import asyncio\n\nasync def judge(prompts, completions, **kw):\n"
                 "    await asyncio.sleep(0)\n    return [float(c == 'yes') for c in completions]\n")
    assert score([load_reward(f"{f}:judge")], [2.0], ["p", "q"], ["yes", "no"], {}).total.tolist() == [2.0, 0.0]


def test_reward_errors_config_key():
    from grpo.config import ConfigError, build_config

    assert build_config({}, {}).reward.reward_errors == "raise"
    assert build_config({"reward": {"reward_errors": "zero"}}).reward.reward_errors == "zero"
    with pytest.raises(ConfigError, match="reward.reward_errors must be raise | zero"):
        build_config({}, {"reward.reward_errors": "skip"})


def test_metrics_ignore_rows_without_any_reward():
    from grpo.state.metrics import reward_metrics

    s = score([("f", lambda **kw: [None, 1.0, 3.0])], None, ["p"] * 3, ["a", "b", "c"], {})
    m = reward_metrics(s)
    assert (m["reward/total/mean"], m["reward/f/mean"], m["reward/f/none_frac"]) == (2.0, 2.0, pytest.approx(1 / 3))


# ---------------------------------------------------------------- containment of user code (docs/reliability.md)


def quits(completions, **kwargs):
    import sys

    sys.exit(0)                          # would end the run with exit code 0 and no checkpoint


async def quits_async(completions, **kwargs):
    raise SystemExit(3)                  # would stop the event loop


class Escape(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


def escapes(completions, **kwargs):
    raise Escape("out")


@pytest.mark.parametrize("fn,raised", [(quits, "SystemExit: 0"), (quits_async, "SystemExit: 3"),
                                       (escapes, "Escape: out")])
def test_sys_exit_and_other_base_exceptions_in_a_reward_are_one_line_errors(fn, raised):
    with pytest.raises(RewardError) as info:
        score([("f", fn)], None, ["p", "q"], ["a", "b"], {})
    assert str(info.value) == f"reward function 'f' raised {raised} for completion 0 ('a') (and 1 more completions)"
    s = score([("f", fn), ("ok", fmt)], None, ["p", "q"], ["a", "<b"], {}, on_error="zero")
    assert s.per_function.tolist() == [[0.0, 0.0], [0.0, 0.5]] and s.errors == {"f": 2, "ok": 0}


def test_keyboard_interrupt_in_a_reward_still_stops():
    def interrupted(completions, **kwargs):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score([("f", interrupted)], None, ["p"], ["a"], {}, on_error="zero")


@pytest.mark.parametrize("out,got", [
    ({"a": 1.0, "b": 0.0}, "a dict"),                  # was read by its keys
    ({1.0, 0.0}, "a set"),
    ((v for v in [1.0, 0.0]), "a generator"),
    ("10", "a str"),
    (1.0, "a float"),
])
def test_a_reward_must_return_a_list_not_a_dict_set_generator_or_string(out, got):
    with pytest.raises(RewardError) as info:
        score([("f", lambda **kw: out)], None, ["p", "q"], ["a", "b"], {})
    assert str(info.value) == f"reward function 'f' must return a list of one value per completion (2), got {got}"


def test_tuples_arrays_and_tensors_are_sequences_of_values():
    import numpy as np

    fns = [("tuple", lambda **kw: (1.0, None)), ("array", lambda **kw: np.array([2.0, 0.5])),
           ("tensor", lambda **kw: torch.tensor([0.25, 3.0]))]
    table = score(fns, None, ["p", "q"], ["a", "b"], {}).per_function.tolist()
    assert table == [[1.0, 2.0, 0.25], [pytest.approx(math.nan, nan_ok=True), 0.5, 3.0]]


def test_each_reward_gets_its_own_copy_of_its_arguments():
    def vandal(prompts, completions, answer, completion_ids, **kwargs):
        completions[0][0]["content"] = "hacked"          # a chat completion's message
        completions.append("extra")
        prompts[0].clear()                               # the prompt's message list (shared by the group)
        answer[0] = "wrong"
        completion_ids[1].append(99)
        return [0.0] * 2

    seen = []

    def witness(prompts, completions, answer, completion_ids, **kwargs):
        seen.append((prompts, completions, answer, completion_ids))
        return [1.0] * len(completions)

    chat = [{"role": "user", "content": "q"}]
    prompts = [chat, chat]
    completions = [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]]
    columns = {"answer": ["1", "2"], "completion_ids": [[5], [6, 7]]}
    original = (repr(prompts), repr(completions), repr(columns))
    score([("vandal", vandal), ("witness", witness)], None, prompts, completions, columns)
    assert seen == [([chat, chat], [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]],
                     ["1", "2"], [[5], [6, 7]])]
    assert (repr(prompts), repr(completions), repr(columns)) == original     # the caller's values are untouched


def test_own_copy_shares_nothing_mutable():
    from grpo.rewards.scoring import own_copy

    value = [[1, 2], ("x", [3]), {"k": [4]}, "s", None]
    copied = own_copy(value)
    assert copied == value and copied is not value
    assert copied[0] is not value[0] and copied[1][1] is not value[1][1] and copied[2]["k"] is not value[2]["k"]


@pytest.fixture
def release():
    """An event the hanging rewards wait on; set at the end so their abandoned threads finish."""
    import threading

    event = threading.Event()
    yield event
    event.set()


def test_a_hanging_reward_times_out_naming_the_function(release):
    import time

    def hangs(completions, **kwargs):
        release.wait(30)
        return [1.0] * len(completions)

    async def hangs_async(completions, **kwargs):
        await asyncio.sleep(30)

    async def blocks_its_loop(completions, **kwargs):     # never awaits: only the loop's thread can be given up
        release.wait(30)

    for fn in (hangs, hangs_async):
        t0 = time.perf_counter()
        with pytest.raises(RewardError) as info:
            score([("ok", fmt), (fn.__name__, fn)], None, ["p", "q"], ["a", "b"], {}, timeout_s=0.2)
        assert str(info.value) == (f"reward function '{fn.__name__}' did not return within reward.timeout_s=0.2 s "
                                   f"on the batch of 2 completions")
        assert time.perf_counter() - t0 < 1.0
    t0 = time.perf_counter()
    s = score([("ok", fmt), ("blocks", blocks_its_loop)], None, ["p", "q"], ["a", "<b"], {}, on_error="zero",
              timeout_s=0.2)
    assert s.per_function.tolist() == [[0.0, 0.0], [0.5, 0.0]] and s.errors == {"ok": 0, "blocks": 2}
    assert time.perf_counter() - t0 < 0.2 + 1.0 + 0.8    # timeout + LOOP_GRACE_S + slack


def test_with_a_timeout_fast_rewards_are_unchanged_and_async_ones_still_run_concurrently():
    fns = [("acc", accuracy_reward), ("fmt", fmt), ("short", inverse_length), ("judge", judge)]
    args = (None, ["2+2", "3+3"], ["4", "<b> 3+3 6"], {"solution": ["4", "7"], "completion_ids": [[5, 6], [1, 2, 3, 4]]})
    assert score(fns, *args, timeout_s=5.0).per_function.tolist() == score(fns, *args).per_function.tolist()


def test_a_reward_that_applies_to_no_completion_warns_once(caplog):
    import logging

    from grpo.rewards.scoring import _WARNED_NO_SIGNAL

    _WARNED_NO_SIGNAL.discard("never_applies")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            score([("never_applies", lambda **kw: [None, None]), ("ok", fmt)], None, ["p", "q"], ["a", "b"],
                  {"answer": ["1", "2"]})
    lines = [r.getMessage() for r in caplog.records if "never_applies" in r.getMessage()]
    assert lines == ["warning: reward function 'never_applies' returned None for all 2 completions of a batch: it "
                     "applies to none of them and gives no learning signal (does it get the columns it needs? it "
                     "was called with prompts, completions, answer)"]


def test_reward_timeout_config_key():
    from grpo.config import ConfigError, build_config

    assert build_config().reward.timeout_s == 0.0
    assert build_config(overrides={"reward.timeout_s": 30}).reward.timeout_s == 30.0
    with pytest.raises(ConfigError, match="reward.timeout_s must be >= 0"):
        build_config(overrides={"reward.timeout_s": -1})


def test_an_import_path_names_a_reward_as_in_trl(tmp_path, monkeypatch):
    """`package.module.function` (TRL's reward_funcs form) imports from the working directory first."""
    pkg = tmp_path / "myrewards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lengths.py").write_text("def reward_len(completions, **kw):\n    return [-abs(20 - len(c)) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "myrewards", raising=False)
    name, fn = load_reward("myrewards.lengths.reward_len")
    assert name == "reward_len" and fn(completions=["x" * 18, "x" * 25]) == [-2, -5]
    assert str(tmp_path) not in sys.path                      # the path is restored
    with pytest.raises(RewardError, match="reward 'myrewards.lengths.nope': module myrewards.lengths has no function 'nope'"):
        load_reward("myrewards.lengths.nope")
    with pytest.raises(RewardError, match="reward 'nosuchpkg.f': module nosuchpkg failed to import: ModuleNotFoundError"):
        load_reward("nosuchpkg.f")


def test_the_no_signal_warning_names_the_columns_a_reward_reads(caplog):
    """math_accuracy reads `answer` or `solution`: on data with neither, the warning says so."""
    import logging

    from grpo.rewards import load_reward
    from grpo.rewards.scoring import _WARNED_NO_SIGNAL

    name, fn = load_reward("math_accuracy")
    _WARNED_NO_SIGNAL.discard(name)
    with caplog.at_level(logging.WARNING):
        score([(name, fn)], None, ["p", "q"], ["<answer>1</answer>", "2"], {"target": ["1", "2"]})
    line = next(r.getMessage() for r in caplog.records if name in r.getMessage())
    assert line.endswith("it was called with prompts, completions, target; it reads a column 'answer' or "
                         "'solution', which the data does not have)")
