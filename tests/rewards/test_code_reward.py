"""The code_execution reward: code extraction, test formats, exact fractions, the pool."""

import json
import time

import pytest

from grpo.rewards.code import extract_code, make_code_execution, parse_tests, same_output, split_asserts

ADD_IO = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ADD_FN = "```python\ndef add(a, b):\n    return a + b\n```"
IO_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"},
            {"input": "-4 4\n", "output": "0"}, {"input": "7 1\n", "output": "8"}]
ADD_ASSERTS = ["assert add(1, 2) == 3", "assert add(7, 1) == 8", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]


@pytest.fixture(scope="module")
def reward():
    return make_code_execution(timeout=2.0, workers=2)


def test_extract_code_takes_the_last_python_or_untagged_block():
    text = ("First try:\n```python\nprint(1)\n```\nshell:\n```bash\nls\n```\nfinal:\n``` py\nprint(2)\n```\n"
            "```text\nnot code\n```")
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("no code here") is None
    assert extract_code("```python\nprint(1)") is None                               # unterminated
    assert extract_code([{"role": "assistant", "content": "```python\nprint(3)\n```"}]) == "print(3)\n"


def test_parse_tests_formats():
    assert parse_tests(None) is None and parse_tests([]) is None and parse_tests("  ") is None
    assert parse_tests(IO_TESTS[:2]) == ("io", [("1 2\n", "3\n"), ("5 5", "10")])
    assert parse_tests(json.dumps(IO_TESTS[:1])) == ("io", [("1 2\n", "3\n")])
    assert parse_tests({"inputs": ["1", "2"], "outputs": ["a", "b"]}) == ("io", [("1", "a"), ("2", "b")])
    assert parse_tests(ADD_ASSERTS[:2]) == ("asserts", ADD_ASSERTS[:2])
    assert parse_tests("x = 2\nassert x == 2\nassert x > 1\n") == ("asserts", ["x = 2\nassert x == 2", "assert x > 1"])
    with pytest.raises(ValueError, match="unsupported tests"):
        parse_tests([1, 2])


def test_split_asserts():
    src = "import math\nassert math.sqrt(4) == 2\nassert (\n    1 + 1 == 2\n)\nprint('done')"
    assert split_asserts(src) == ["import math\nassert math.sqrt(4) == 2", "assert (\n    1 + 1 == 2\n)\nprint('done')"]
    humaneval_style = "def check(f):\n    assert f(1) == 2\ncheck(g)"
    assert split_asserts(humaneval_style) == [humaneval_style]                      # no top-level assert
    assert split_asserts("assert (") == ["assert ("]                                # not Python: one check


def test_same_output_ignores_trailing_whitespace_only():
    assert same_output("1 2 \n3\t\n\n", "1 2\n3")
    assert not same_output("1  2\n3", "1 2\n3") and not same_output("1\n\n2", "1\n2")


def test_stdin_stdout_scores_exact_fractions(reward):
    wrong_on_negatives = "```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```"
    crashes_on_five = "```python\na, b = map(int, input().split())\nassert a != 5\nprint(a + b)\n```"
    rewards = reward(["p"] * 4, [ADD_IO, wrong_on_negatives, crashes_on_five, "print(1)"], tests=[IO_TESTS] * 4)
    assert rewards == [1.0, 0.75, 0.75, 0.0]                                         # no fenced code -> 0


def test_asserts_score_exact_fractions(reward):
    off_by_one_for_zero = "```python\ndef add(a, b):\n    return a + b if a else 1\n```"
    raises_for_sevens = "```python\ndef add(a, b):\n    if a == 7:\n        raise ValueError\n    return a + b\n```"
    exits_early = "```python\nimport sys\nsys.exit(0)\n```"
    rewards = reward(["p"] * 4, [ADD_FN, off_by_one_for_zero, raises_for_sevens, exits_early],
                     tests=[ADD_ASSERTS] * 3 + ["\n".join(ADD_ASSERTS)])
    assert rewards == [1.0, 0.75, 0.75, 0.0]                                         # exiting early passes nothing


def test_checks_share_the_program_namespace_and_count_until_a_hang(reward):
    fast = make_code_execution(timeout=1.0)
    hangs_on_two = "```python\nimport time\ndef add(a, b):\n    while a == 2:\n        time.sleep(1)\n" \
                   "    return a + b\n```"
    start = time.monotonic()
    assert fast(["p"], [hangs_on_two], tests=[ADD_ASSERTS]) == [0.5]                 # checks 0 and 1 reported
    assert time.monotonic() - start < 2.0
    setup_then_asserts = "total = add(1, 1)\nassert total == 2\nassert __name__ == '__main__'"
    assert reward(["p"], [ADD_FN], tests=[setup_then_asserts]) == [1.0]


def test_none_tests_and_missing_column(reward):
    rewards = reward(["p"] * 3, [ADD_IO, ADD_IO, "no code"], tests=[None, IO_TESTS[:1], IO_TESTS[:1]])
    assert rewards == [None, 1.0, 0.0]
    assert reward(["p"] * 2, [ADD_IO, ADD_IO]) == [None, None]


def test_pool_matches_one_at_a_time():
    programs = [ADD_IO, "```python\nprint(sum(map(int, input().split())) % 5)\n```",
                "```python\nprint(input())\n```"] * 2 + ["```python\nwhile True:\n    pass\n```"]
    tests = [IO_TESTS[:2]] * len(programs)
    one = make_code_execution(timeout=0.5, workers=1)(["p"] * len(programs), programs, tests=tests)
    pooled = make_code_execution(timeout=0.5, workers=4)(["p"] * len(programs), programs, tests=tests)
    assert pooled == one == [1.0, 0.5, 0.0] * 2 + [0.0]


def test_registered_as_builtin():
    from grpo.rewards.builtin import BUILTIN_REWARDS

    assert BUILTIN_REWARDS["code_execution"](["p"], [ADD_FN], tests=[ADD_ASSERTS]) == [1.0]
