"""Tests for the embedded arithmetic task: generator, splits, demonstrations, verifier."""

import pytest

from grpo.data.tasks import arithmetic as A


def test_generate_is_deterministic_and_seeded():
    a = A.generate("train", 50, seed=3)
    b = A.generate("train", 50, seed=3)
    c = A.generate("train", 50, seed=4)
    assert a == b
    assert a != c
    assert all(set(r) == {"prompt", "answer"} for r in a)


def test_rows_have_expected_shape_and_answers():
    spec = A.DEFAULT_SPEC
    for row in A.generate("test", 100, seed=0):
        prompt = row["prompt"]
        assert prompt.endswith("=")
        problem = A.problem_of(prompt)
        numbers = [int(x) for x in problem.replace("-", "+").split("+")]
        assert len(numbers) == spec.n_operands
        assert all(spec.low <= x <= spec.high for x in numbers)
        assert int(row["answer"]) == eval(problem)  # left-to-right +/- equals Python's evaluation


def test_nonnegative_partials():
    assert A.DEFAULT_SPEC.nonnegative
    for row in A.generate("train", 300, seed=2):
        assert all(step[3] >= 0 for step in A.evaluate_steps(A.problem_of(row["prompt"])))
    signed = A.TaskSpec(n_operands=4, low=0, high=19, nonnegative=False)
    rows = A.generate("train", 300, seed=2, spec=signed)
    assert any(int(r["answer"]) < 0 for r in rows)


def test_unique_within_call():
    rows = A.generate("test", 300, seed=0)
    assert len({r["prompt"] for r in rows}) == 300


def test_splits_are_disjoint_and_stable():
    train = {r["prompt"] for r in A.generate("train", 3000, seed=0)}
    test = {r["prompt"] for r in A.generate("test", 1000, seed=0)}
    assert not train & test
    for prompt in test:
        assert A.split_of(A.problem_of(prompt)) == "test"
    for prompt in list(train)[:500]:
        assert A.split_of(A.problem_of(prompt)) == "train"
    # The split uses SHA-256 (not Python's salted hash): pin values so it never drifts.
    half = A.TaskSpec(test_percent=50)
    problems = ("47+28-19", "10+10+10", "99-99-99", "12-30+5", "1+2+3", "50-25+75")
    assert [A.split_of(p, half) for p in problems] == ["test", "test", "train", "train", "train", "test"]


def test_split_share_matches_spec():
    spec = A.TaskSpec(low=0, high=9, test_percent=20)
    problems = [f"{a}{o1}{b}{o2}{c}" for a in range(10) for b in range(10) for c in range(10)
                for o1 in "+-" for o2 in "+-"]
    share = sum(A.split_of(p, spec) == "test" for p in problems) / len(problems)
    assert 0.17 < share < 0.23
    tiny = A.TaskSpec(n_operands=2, low=0, high=3, ops="+", test_percent=50)  # 16 problems in all
    n_test = sum(A.split_of(f"{a}+{b}", tiny) == "test" for a in range(4) for b in range(4))
    assert len(A.generate("test", n_test, spec=tiny)) == n_test
    with pytest.raises(ValueError):
        A.generate("test", n_test + 1, spec=tiny)  # not enough distinct test problems
    with pytest.raises(ValueError):
        A.generate("valid", 3)


def test_completions():
    assert A.worked_completion("47+28-19") == "<think>47+28=75,75-19=56</think><answer>56</answer>"
    assert A.direct_completion("47+28-19") == "<think></think><answer>56</answer>"
    assert A.worked_completion("12-30+5") == "<think>12-30=-18,-18+5=-13</think><answer>-13</answer>"
    assert A.solve("12-30-5") == -23


def test_sft_examples_mix_and_train_only():
    rows = A.sft_examples(2000, seed=0, worked_fraction=0.3)
    assert rows == A.sft_examples(2000, seed=0, worked_fraction=0.3)
    worked = [A.is_worked(r["completion"]) for r in rows]
    assert 0.26 < sum(worked) / len(rows) < 0.34
    for r in rows:
        assert A.split_of(A.problem_of(r["prompt"])) == "train"
        assert A.format_ok(r["completion"]) and A.is_correct(r["completion"], r["answer"])
    assert not any(A.is_worked(r["completion"]) for r in A.sft_examples(200, worked_fraction=0.0))
    assert all(A.is_worked(r["completion"]) for r in A.sft_examples(200, worked_fraction=1.0))
    with pytest.raises(ValueError):
        A.sft_examples(10, worked_fraction=1.5)


@pytest.mark.parametrize(
    "completion, answer, correct, extracted, fmt",
    [
        ("<think>47+28=75,75-19=56</think><answer>56</answer>", "56", True, "56", True),
        ("<think></think><answer>56</answer>", "56", True, "56", True),
        ("<think></think><answer>57</answer>", "56", False, "57", True),
        ("<think></think><answer> 56 </answer>", "56", True, "56", True),
        ("  <think></think><answer>56</answer>\n", "56", True, "56", True),
        ("<think></think><answer>56</answer><|endoftext|>", "56", True, "56", True),
        ("<think></think><answer>-13</answer>", "-13", True, "-13", True),
        ("<think></think><answer>056</answer>", 56, True, "056", True),
        ("<think></think><answer>fifty</answer>", "56", False, "fifty", True),
        ("<think></think><answer>5_6</answer>", "56", False, "5_6", True),
        ("<think></think><answer></answer>", "56", False, "", True),
        ("<answer>56</answer>", "56", True, "56", False),
        ("<think>56</think>", "56", False, None, False),
        ("56", "56", False, None, False),
        ("", "56", False, None, False),
        ("<think></think><answer>56", "56", False, None, False),
        ("<think></think><answer>1</answer><answer>56</answer>", "56", True, "56", False),
        ("<think></think><answer>56</answer> trailing", "56", True, "56", False),
        ("x<think></think><answer>56</answer>", "56", True, "56", False),
        ("<think><think></think><answer>56</answer>", "56", True, "56", False),
        # where the task's old parser and think_format's disagreed; one parser now (grpo.rewards.text)
        ("<think>1+2=3</think>\n<answer>56</answer>", "56", True, "56", True),     # whitespace between blocks
        ("<think></think><answer>56</answer><|im_end|>", "56", True, "56", True),   # any trailing special token
    ],
)
def test_verifier_table(completion, answer, correct, extracted, fmt):
    assert A.extract_answer(completion) == extracted
    assert A.is_correct(completion, answer) is correct
    assert A.format_ok(completion) is fmt


def test_is_worked():
    assert A.is_worked("<think>1+2=3,3+4=7</think><answer>7</answer>")
    assert not A.is_worked("<think></think><answer>7</answer>")
    assert not A.is_worked("<think> </think><answer>7</answer>")
    assert not A.is_worked("garbage")


def test_with_solutions_adds_the_worked_completion_and_keeps_the_rows():
    from grpo.data.tasks.arithmetic import is_correct, with_solutions

    rows = [{"prompt": "47+28-19=", "answer": "56"}]
    out = with_solutions(rows)
    assert out == [{"prompt": "47+28-19=", "answer": "56",
                    "solution": "<think>47+28=75,75-19=56</think><answer>56</answer>"}]
    assert "solution" not in rows[0] and is_correct(out[0]["solution"], "56")
