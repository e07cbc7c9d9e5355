import math

import pytest
import torch

from grpo.rewards import RewardError, load_reward, score
from grpo.rewards.builtin import accuracy_reward, format_reward


def test_builtin_accuracy_and_format():
    comps = ["<think>1+2=3</think><answer>3</answer>", "<think></think><answer>4</answer>", "no tags 3"]
    assert accuracy_reward(["p"] * 3, comps, answer=["3", "3", "3"]) == [1.0, 0.0, 0.0]
    assert format_reward(["p"] * 3, comps) == [1.0, 1.0, 0.0]
    assert accuracy_reward(["p"], ["x"]) == [None]  # no answer column: does not apply


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


@pytest.mark.parametrize("ret,message", [
    ([float("nan")], "returned nan"), ([float("inf")], "returned inf"), (["1"], "expected a finite number"),
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
    assert load_reward("accuracy")[1] is accuracy_reward
