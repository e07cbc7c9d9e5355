"""grpo/data/tasks/strings.py: the second embedded domain (reverse / sort a string of digits)."""

import pytest

from grpo.data.tasks import TASKS, strings
from grpo.rewards import load_reward


def test_solve_and_the_disjoint_deterministic_splits():
    assert strings.solve("reverse:4719") == "9174" and strings.solve("sort:4719") == "1479"
    for bad in ("shout:123", "sort:12a", "reverse:"):
        with pytest.raises(ValueError, match="not a strings problem"):
            strings.solve(bad)
    train, test = strings.generate("train", 300, seed=1), strings.generate("test", 60, seed=1)
    assert train == strings.generate("train", 300, seed=1) and len({r["prompt"] for r in train}) == 300
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert all(strings.split_of(r["prompt"].removesuffix("=")) == "test" for r in test)
    assert all(r["answer"] == strings.solve(r["prompt"].removesuffix("=")) for r in train + test)
    assert TASKS["strings"] is strings and strings.DEFAULT_REWARDS == ("exact_match", "format")


def test_worked_demonstrations_pass_the_tasks_rewards():
    assert strings.worked_completion("reverse:407") == "<think>4,0,7</think><answer>704</answer>"
    mixed = strings.sft_examples(200, seed=2, worked_fraction=0.3)
    worked = sum(not r["completion"].startswith("<think></think>") for r in mixed)
    assert 40 <= worked <= 80 and mixed == strings.sft_examples(200, seed=2, worked_fraction=0.3)
    rows = strings.sft_examples(20, seed=2)
    rewards = [load_reward(name)[1] for name in strings.DEFAULT_REWARDS]
    prompts, completions, answers = [r["prompt"] for r in rows], [r["completion"] for r in rows], [r["answer"] for r in rows]
    for fn in rewards:
        assert fn(prompts, completions, answer=answers) == [1.0] * 20
    wrong = [c.replace("<answer>", "<answer>x") for c in completions]
    assert rewards[0](prompts, wrong, answer=answers) == [0.0] * 20


def test_grpo_and_eval_run_on_the_strings_task(tmp_path, capsys):
    """data.task=strings: the task's own rewards (exact_match, format) train and evaluate without --reward."""
    import json

    from grpo.cli.main import main
    from tests.run_helpers import make_micro_dir

    model = make_micro_dir(tmp_path / "micro")
    out = tmp_path / "run"
    assert main(["train", "--model", str(model), "--output-dir", str(out), "--max-steps", "1", "--data.task", "strings",
                 "--rollout.num_generations", "2", "--train.prompts_per_step", "2", "--rollout.max_new_tokens", "4",
                 "--log.progress_bar", "false", "--cpu.num_threads", "1"]) == 0
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/exact_match/mean" in record and "reward/format/mean" in record
    capsys.readouterr()
    assert main(["eval", "--model", str(model), "--task", "strings", "--problems", "3", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.split()[0::2] == ["exact_match", "format", "completion_length"]
