import json

import pytest

from grpo.cli.main import main

DATASET = [{"prompt": "Half?", "answer": r"\frac{1}{2}"},
           {"prompt": "Three?", "solution": r"It is \boxed{3}."},
           {"prompt": "Lang?", "answer": "1", "language": "zh"}]

COMPLETIONS = [
    {"index": 0, "completion": "<think>half</think><answer>0.5</answer>"},
    {"index": 1, "completion": "<think>so</think><answer>4</answer>"},
    {"prompt": "inline", "answer": "2", "completion": "no answer here"},
    {"prompt": "inline", "completion": r"<think>Думаю</think> \boxed{2}"},            # no reference: None
    {"index": 2, "answer": "2", "completion": "<think>中文</think><answer>2</answer>"},  # own answer overrides
]

REWARDS_PY = """
import asyncio

async def judge(prompts, completions, **kw):
    await asyncio.sleep(0)
    return [1.0 if p == "inline" else None for p in prompts]

def fragile(prompts, completions, **kw):
    return [1 / (len(c) - 14) for c in completions]      # "no answer here" has 14 characters
"""


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "r.py").write_text(REWARDS_PY)
    return {"dataset": write_jsonl(tmp_path / "ds.jsonl", DATASET),
            "completions": write_jsonl(tmp_path / "c.jsonl", COMPLETIONS), "rewards": str(tmp_path / "r.py"),
            "dir": tmp_path}


def table(out: str) -> dict[str, list[str]]:
    """The printed table as {reward: [mean, none, errors, n]}."""
    lines = out.strip().splitlines()
    assert lines[0].startswith("scored ") and lines[1].split() == ["reward", "mean", "none", "errors", "n"]
    return {line.split()[0]: line.split()[1:] for line in lines[2:]}


def run(files, *args):
    return main(["rewards", "check", "--completions", files["completions"], "--dataset", files["dataset"], *args])


def test_check_prints_one_row_per_function(files, capsys):
    assert run(files, "--reward", "math_accuracy", "--reward", "think_format", "--reward", "tag_count",
               "--reward", "language_consistency", "--reward", f"{files['rewards']}:judge") == 0
    rows = table(capsys.readouterr().out)
    assert rows == {
        "math_accuracy": ["0.5000", "20.0%", "0", "4"],          # 1, 0, 0, -, 1
        "think_format": ["0.6000", "0.0%", "0", "5"],            # 1, 1, 0, 0, 1
        "tag_count": ["0.7000", "0.0%", "0", "5"],               # 1, 1, 0, 0.5, 1
        "language_consistency": ["0.8000", "0.0%", "0", "5"],    # en: 1, 1, 1, 0 (Cyrillic); zh: 1
        "judge": ["1.0000", "60.0%", "0", "2"],                  # only the inline rows
        "total": ["2.9000", "0.0%", "0", "5"],                   # (4 + 3 + 2 + 1.5 + 4) / 5
    }


def test_check_uses_weights_and_parameters_from_config(files, capsys):
    config = files["dir"] / "cfg.yaml"
    config.write_text("reward:\n  functions: [math_accuracy, 'cosine_length:max_len=2']\n  weights: [2.0, 0.0]\n")
    assert run(files, "--config", str(config)) == 0
    rows = table(capsys.readouterr().out)
    # 1 word correct 0.75, 1 word wrong -0.25, 3 words wrong (clipped) 0.0, no reference, 1 word correct 0.75
    assert rows["cosine_length:max_len=2"] == ["0.3125", "20.0%", "0", "4"]
    assert rows["total"] == ["1.0000", "20.0%", "0", "4"]        # 2 * (1, 0, 0, 1) / 4; row 3 has no reward


def test_reward_error_names_file_line_and_completion(files, capsys):
    assert run(files, "--reward", f"{files['rewards']}:fragile") == 2
    err = capsys.readouterr().err
    assert err == (f"error: {files['completions']}:3: reward function 'fragile' raised ZeroDivisionError: division by "
                   "zero for completion 2 ('no answer here')\n")


def test_reward_errors_zero_counts_them(files, capsys):
    assert run(files, "--reward", f"{files['rewards']}:fragile", "--reward-errors", "zero") == 0
    rows = table(capsys.readouterr().out)
    assert rows["fragile"][1:] == ["0.0%", "1", "5"] and rows["total"][2] == "1"


@pytest.mark.parametrize("lines,message", [
    (['{"index": 0}'], "c.jsonl:1: 'completion' must be a string or a list of chat messages, got NoneType"),
    (['{"index": 0, "completion": 3}'], "c.jsonl:1: 'completion' must be a string or a list of chat messages, got int"),
    (['{"index": 0, "completion": "a"}', '{"completion": "b"}'], "c.jsonl:2: needs a 'prompt' or an 'index' into --dataset"),
    (['{"index": 3, "completion": "a"}'], "c.jsonl:1: 'index' must be a row number in 0..2 of the dataset, got 3"),
    (['{"index": "0", "completion": "a"}'], "c.jsonl:1: 'index' must be a row number in 0..2 of the dataset, got '0'"),
    (['', '{"index": 0, "completion": "a"', ], "c.jsonl:2: invalid JSON"),
    (['[1, 2]'], "c.jsonl:1: expected a JSON object per line"),
    ([''], "c.jsonl: no completions"),
])
def test_bad_completion_files(files, capsys, lines, message):
    (files["dir"] / "c.jsonl").write_text("\n".join(lines) + "\n")
    assert run(files, "--reward", "think_format") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("args,message", [
    (["--completions", "missing.jsonl"], "completions file not found: missing.jsonl"),
    (["--completions", "{c}", "--reward", "nope"], "unknown reward 'nope'"),
    (["--completions", "{c}", "--dataset", "missing.jsonl"], "dataset file not found: missing.jsonl"),
    (["--completions", "{c}", "--reward", "cosine_length:max_len=x"], "parameter max_len must be a number"),
    (["--completions", "{c}", "--reward.weights", "[1, 2, 3]"], "reward.weights must have one weight per entry"),
])
def test_bad_arguments(files, capsys, args, message):
    args = [a.replace("{c}", files["completions"]) for a in args]
    assert main(["rewards", "check", *args]) == 2
    assert message in capsys.readouterr().err


def test_index_without_dataset(files, capsys):
    assert main(["rewards", "check", "--completions", files["completions"], "--reward", "think_format"]) == 2
    assert "c.jsonl:1: 'index' needs a dataset (--dataset or data.dataset)" in capsys.readouterr().err


def test_inline_rows_need_no_dataset(files, capsys):
    path = write_jsonl(files["dir"] / "inline.jsonl", [
        {"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2", "completion": r"\boxed{2}"},
        {"prompt": "x", "answer": "2", "completion": [{"role": "assistant", "content": "<answer>3</answer>"}]}])
    assert main(["rewards", "check", "--completions", path, "--reward", "math_accuracy"]) == 0
    assert table(capsys.readouterr().out)["math_accuracy"] == ["0.5000", "0.0%", "0", "2"]


TRL_REWARDS_PY = '''
import asyncio

def accuracy_reward(completions, solution, **kwargs):          # TRL's signature, conversational data
    return [float(completion[0]["content"].strip() == s) for completion, s in zip(completions, solution)]

def fmt(completions, **kw):
    return [0.5 if completion[0]["content"].startswith("<") else 0.0 for completion in completions]

async def judge(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [float(p[-1]["role"] == "user") for p in prompts]

def strict(completions, solution):
    return [1.0] * len(completions)
'''


@pytest.fixture
def trl_files(tmp_path):
    (tmp_path / "trl.py").write_text(TRL_REWARDS_PY)
    user = [{"role": "user", "content": "1+1?"}]
    rows = [{"prompt": user, "solution": "2", "completion": "2"},
            {"prompt": user, "solution": "2", "completion": "<b>3"},
            {"prompt": user, "solution": "4", "completion": [{"role": "assistant", "content": " 4 "}]}]
    return str(tmp_path / "trl.py"), write_jsonl(tmp_path / "chat.jsonl", rows)


def test_trl_signatures_and_conversational_completions(trl_files, capsys):
    rewards, completions = trl_files
    assert main(["rewards", "check", "--completions", completions, "--reward", f"{rewards}:accuracy_reward",
                 "--reward", f"{rewards}:fmt", "--reward", f"{rewards}:judge"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows["accuracy_reward"] == ["0.6667", "0.0%", "0", "3"]    # 1, 0, 1: text completions became messages
    assert rows["fmt"] == ["0.1667", "0.0%", "0", "3"]                # 0, 0.5, 0
    assert rows["judge"] == ["1.0000", "0.0%", "0", "3"]
    assert rows["total"] == ["1.8333", "0.0%", "0", "3"]              # (2 + 1.5 + 2) / 3


def test_a_function_that_cannot_take_its_arguments_names_itself(trl_files, capsys):
    rewards, completions = trl_files
    assert main(["rewards", "check", "--completions", completions, "--reward", f"{rewards}:strict"]) == 2
    assert capsys.readouterr().err == (
        f"error: {completions}: reward function 'strict' cannot take its arguments: got an unexpected keyword "
        "argument 'prompts' (called with prompts, completions, solution); reward functions are called by keyword "
        "as in TRL: fn(prompts=, completions=, completion_ids=, **columns); add **kwargs\n")
