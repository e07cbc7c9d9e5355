"""verl's custom reward functions and verl-style Parquet datasets (grpo/rewards/verl.py, grpo/data/datasets_io.py)."""

import json
import math
import textwrap

import pandas as pd
import pytest

import grpo
from grpo.config import DataConfig
from grpo.data.prompts import IDS_KEY, load_prompts, tokenize_prompts
from grpo.modeling.models import build_model, build_tokenizer
from grpo.rewards import RewardError, score
from grpo.rewards.context import RewardLog, TrainerState, reward_context
from grpo.rewards.verl import (accepted_arguments, adapt_reward, extra_columns, extra_metrics, from_verl,
                               ground_truth_at, is_verl_score_fn, split_result)

# Only characters of the embedded character-level vocabulary, so the rendered prompt decodes back exactly.
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
# Rows as verl's data preparation writes them (docs/preparation/prepare_data.rst, the GSM8K example).
VERL_ROWS = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
              "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
              "extra_info": {"split": "train", "index": i}}
             for i, (a, b) in enumerate((a, b) for a in range(4) for b in range(4))]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's documented signature (docs/preparation/reward_function.rst): 1.0 when the answer is in the text."""
    return 1.0 if ground_truth in solution_str else 0.0


def chat(text: str) -> list:
    return [{"role": "assistant", "content": text}]


def columns(rows: list[dict]) -> dict[str, list]:
    return {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}


def chat_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def write_parquet(path, rows: list[dict], writer: str = "pandas"):
    """`rows` as Parquet (dicts become structs), written by pandas or by `datasets` (verl's preprocessing scripts)."""
    if writer == "pandas":
        pd.DataFrame(rows).to_parquet(path)
    else:
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(str(path))
    return path


# ---------------------------------------------------------------- recognising verl's signature


def test_is_verl_score_fn_reads_the_signature():
    import functools

    def trl_style(completions, solution, **kwargs):
        return [0.0 for _ in completions]

    def with_kwargs(solution_str, ground_truth, **kwargs):
        return 0.0

    assert is_verl_score_fn(compute_score) and is_verl_score_fn(with_kwargs)
    assert is_verl_score_fn(functools.partial(compute_score, extra_info={}))
    assert not is_verl_score_fn(trl_style)
    assert not is_verl_score_fn(lambda solution_str, **kw: 0.0)          # both names are needed
    assert not is_verl_score_fn("compute_score") and not is_verl_score_fn(len)
    assert not is_verl_score_fn(from_verl(compute_score))                 # a wrapper is grpo-style already


def test_adapt_reward_wraps_only_verl_functions_and_keeps_the_name():
    def accuracy(completions, **kwargs):
        return [1.0] * len(completions)

    assert adapt_reward("accuracy", accuracy) == ("accuracy", accuracy)    # the same object
    name, fn = adapt_reward("compute_score", compute_score)
    assert name == "compute_score" and fn.__name__ == "compute_score" and fn.verl_score_fn is compute_score
    assert fn(prompts=["q"], completions=["4"], reward_model=[{"ground_truth": "4"}]) == [1.0]
    assert from_verl(compute_score, name="gsm8k").__name__ == "gsm8k"


# ---------------------------------------------------------------- the call


def test_each_completion_is_scored_with_verls_four_arguments():
    seen = []

    def recorder(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        seen.append((data_source, solution_str, ground_truth, extra_info, sorted(kwargs)))
        return float(len(solution_str))

    rows = VERL_ROWS[:2]
    fn = from_verl(recorder)
    out = fn(prompts=[r["prompt"] for r in rows], completions=[chat("12"), chat("345")], **columns(rows),
             completion_ids=[[1], [2]], trainer_state=TrainerState(), log_metric=print, log_extra=print)
    assert out == [2.0, 3.0]
    assert seen == [("openai/gsm8k", "12", "0", {"split": "train", "index": 0}, []),      # kwargs: nothing else
                    ("openai/gsm8k", "345", "1", {"split": "train", "index": 1}, [])]


def test_string_completions_ground_truth_column_and_absent_columns():
    seen = []

    def recorder(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 0.5

    out = from_verl(recorder)(prompts=["1+1=", "2+2="], completions=["2", "5"], ground_truth=["2", "4"])
    assert out == [0.5, 0.5]
    assert seen == [(None, "2", "2", None), (None, "5", "4", None)]


def test_ground_truth_prefers_reward_model_then_the_column():
    cols = {"reward_model": [{"style": "rule", "ground_truth": "7"}, {"style": "rule"}], "ground_truth": ["x", "y"]}
    assert ground_truth_at(cols, 0, "f") == "7"
    assert ground_truth_at(cols, 1, "f") == "y"                  # no ground_truth key in this row's dict
    with pytest.raises(RewardError, match=r"^verl reward function 'f': completion 0 has no ground truth: the dataset "
                                          r"needs a 'reward_model' column holding \{'ground_truth': \.\.\.\} or a "
                                          r"'ground_truth' column \(columns: answer\)$"):
        ground_truth_at({"answer": ["3"]}, 0, "f")


def test_a_missing_ground_truth_is_a_one_line_error_naming_the_function_through_scoring():
    with pytest.raises(RewardError) as e:
        score([("compute_score", from_verl(compute_score))], None, ["1+1="], ["2"], {"answer": ["2"]})
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("reward function 'compute_score' raised RewardError: verl reward function "
                              "'compute_score': completion 0 has no ground truth")
    assert "'reward_model'" in message and "'ground_truth'" in message


def test_a_function_gets_only_the_arguments_it_names():
    def short(solution_str, ground_truth):
        return float(solution_str == ground_truth)

    assert accepted_arguments(short, "short") == ("solution_str", "ground_truth")
    assert accepted_arguments(compute_score, "c") == ("data_source", "solution_str", "ground_truth", "extra_info")
    out = from_verl(short)(prompts=["a", "b"], completions=["3", "4"], ground_truth=["3", "3"], data_source=["d", "d"])
    assert out == [1.0, 0.0]


def test_a_required_argument_grpo_does_not_pass_is_an_error_when_wrapping():
    async def genrm(data_source, solution_str, ground_truth, extra_info, reward_router_address):
        return 0.0

    with pytest.raises(RewardError, match=r"^verl reward function 'genrm' requires 'reward_router_address', which "
                                          r"grpo does not pass \(it passes data_source, solution_str, ground_truth, "
                                          r"extra_info\)$"):
        from_verl(genrm)


# ---------------------------------------------------------------- results


def test_results_numbers_dicts_none_and_bools():
    assert split_result(0.25, "f") == (0.25, {})
    assert split_result(None, "f") == (None, {})
    assert split_result(True, "f") == (1.0, {})
    assert split_result({"score": 1, "acc": True, "pred": "4"}, "f") == (1, {"acc": True, "pred": "4"})
    assert split_result({"score": False}, "f") == (0.0, {})
    import numpy as np
    import torch

    score_, extras = split_result({"score": np.float32(0.5), "acc": np.bool_(True), "n": torch.tensor(3)}, "f")
    assert (score_, extras) == (0.5, {"acc": True, "n": 3})
    assert type(score_) is float and type(extras["acc"]) is bool and type(extras["n"]) is int
    assert split_result(np.bool_(False), "f") == (0.0, {}) and split_result(torch.tensor(0.25), "f") == (0.25, {})
    with pytest.raises(RewardError, match=r"^verl reward function 'f' returned a dict without a 'score' key "
                                          r"\(keys: acc, pred\)$"):
        split_result({"acc": 1.0, "pred": "4"}, "f")


def test_extra_values_become_metrics_and_sample_columns():
    extras = [{"acc": True, "pred": "4", "len": 3}, {"acc": False, "pred": None, "len": float("nan")},
              {"acc": 1.0, "pred": "5", "trace": [1, 2]}]
    # acc: (1 + 0 + 1) / 3; len: only the finite 3; pred is text; trace is no number
    assert extra_metrics(extras, "cs") == {"reward_extra/cs/acc": pytest.approx(2 / 3), "reward_extra/cs/len": 3.0}
    cols = extra_columns(extras, "cs")
    assert cols["cs/acc"] == [True, False, 1.0] and cols["cs/pred"] == ["4", None, "5"]
    assert cols["cs/len"][0] == 3 and math.isnan(cols["cs/len"][1]) and cols["cs/len"][2] is None
    assert "cs/trace" not in cols                                      # a list is not a JSON scalar


def test_dict_scores_none_and_logging_through_grpos_scoring():
    def graded(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        if extra_info["index"] == 2:
            return None                                                # does not apply
        return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth,
                "pred": solution_str}

    rows = VERL_ROWS[:3]                                               # ground truths "0", "1", "2"
    with reward_context(TrainerState()) as log:
        scored = score([("graded", from_verl(graded))], None, [r["prompt"] for r in rows],
                       [chat("0"), chat("7"), chat("2")], columns(rows))
    assert scored.per_function[:, 0].tolist()[:2] == [1.0, 0.0] and math.isnan(scored.per_function[2, 0])
    assert log.values == {"reward_extra/graded/acc": [0.5]}           # (1 + 0) / 2 completions that returned one
    assert log.extras == {"graded/acc": [True, False, None], "graded/pred": ["0", "7", None]}


def test_without_a_log_context_extras_are_dropped_and_scores_returned():
    fn = from_verl(lambda data_source, solution_str, ground_truth, extra_info: {"score": 2.0, "acc": 1.0})
    assert fn(prompts=["q"], completions=["a"], ground_truth=["a"]) == [2.0]
    log = RewardLog()
    assert fn(prompts=["q"], completions=["a"], ground_truth=["a"], log_metric=log.log_metric) == [2.0]
    assert log.values == {"reward_extra/<lambda>/acc": [1.0]}


def test_async_functions_are_awaited_concurrently():
    import asyncio

    running = {"now": 0, "most": 0}

    async def judge(data_source, solution_str, ground_truth, extra_info=None):
        running["now"] += 1
        running["most"] = max(running["most"], running["now"])
        await asyncio.sleep(0.01)
        running["now"] -= 1
        return {"score": float(solution_str == ground_truth)}

    fn = from_verl(judge)
    assert asyncio.iscoroutinefunction(fn) and fn.__name__ == "judge"
    scored = score([("judge", fn)], None, ["a", "b", "c"], ["1", "2", "3"], {"ground_truth": ["1", "0", "3"]})
    assert scored.per_function[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert running["most"] == 3                                        # all three calls overlapped


# ---------------------------------------------------------------- verl's Parquet dataset


@pytest.mark.parametrize("writer", ["pandas", "datasets"])
def test_a_verl_parquet_dataset_loads_with_chat_prompts_and_dict_columns_intact(tmp_path, writer):
    path = write_parquet(tmp_path / "train.parquet", VERL_ROWS[:2], writer)
    tok = chat_tokenizer()
    ps = load_prompts(DataConfig(dataset=str(path)), tokenizer=tok)
    assert ps.conversational
    assert [tok.decode(r[IDS_KEY]) for r in ps.rows] == ["user: 0+0=\nassistant:", "user: 0+1=\nassistant:"]
    batch = tokenize_prompts(tok, ps.rows)
    assert batch.prompts == [r["prompt"] for r in VERL_ROWS[:2]]       # rewards get the raw messages
    assert batch.columns == {"ability": ["math", "math"], "data_source": ["openai/gsm8k", "openai/gsm8k"],
                             "extra_info": [{"split": "train", "index": 0}, {"split": "train", "index": 1}],
                             "reward_model": [{"style": "rule", "ground_truth": "0"},
                                              {"style": "rule", "ground_truth": "1"}]}


def test_parquet_structs_fill_keys_other_rows_have_with_none(tmp_path):
    # Parquet stores a dict column as one struct type: a key that only some rows have is None in the others
    # (verl reads such files through the same `datasets` library, so its reward functions see the same).
    rows = [dict(VERL_ROWS[0], extra_info={"index": 0}), dict(VERL_ROWS[1], extra_info={"index": 1, "question": "q"})]
    ps = load_prompts(DataConfig(dataset=str(write_parquet(tmp_path / "t.parquet", rows))), tokenizer=chat_tokenizer())
    assert [r["extra_info"] for r in ps.rows] == [{"index": 0, "question": None}, {"index": 1, "question": "q"}]


def test_one_training_step_on_a_verl_dataset_with_a_verl_reward(tmp_path):
    seen = []

    def gsm8k_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, ground_truth, extra_info))
        correct = ground_truth in solution_str
        return {"score": 1.0 if correct else 0.1 * len(solution_str), "acc": correct}

    path = write_parquet(tmp_path / "train.parquet", VERL_ROWS)
    tok = chat_tokenizer()
    model = build_model(tok, "micro", seed=0)
    out = tmp_path / "run"
    trainer = grpo.Trainer(model, reward_funcs=[from_verl(gsm8k_score)], train_dataset=str(path), tokenizer=tok,
                           config={"max_steps": 1, "num_generations": 2, "learning_rate": 1e-2,
                                   "max_completion_length": 4, "train.prompts_per_step": 2,
                                   "log.progress_bar": False, "cpu.num_threads": 1, "train.output_dir": str(out)})
    assert trainer.config.reward.functions == ["gsm8k_score"]
    assert trainer.train().steps == 1
    assert len(seen) == 4                                               # 2 prompts x 2 completions
    by_index = {r["extra_info"]["index"]: r for r in VERL_ROWS}
    for data_source, ground_truth, extra_info in seen:                  # the row's values, as written
        row = by_index[extra_info["index"]]
        assert (data_source, ground_truth, extra_info) == (row["data_source"], row["reward_model"]["ground_truth"],
                                                           row["extra_info"])
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reward/gsm8k_score/mean" in metrics and 0.0 <= metrics["reward_extra/gsm8k_score/acc"] <= 1.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(isinstance(s["extra"]["gsm8k_score/acc"], bool) for s in samples)


# ---------------------------------------------------------------- after the lead wires adapt_reward into the loaders

REWARD_FILE = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(solution_str.strip() == ground_truth), "pred": solution_str.strip()}
''')


def _wired(fn) -> bool:
    return getattr(fn, "verl_score_fn", None) is not None


def test_wired_file_and_module_loaders_wrap_verl_functions(tmp_path, monkeypatch):
    from grpo.rewards import load_reward

    (tmp_path / "my_verl_reward.py").write_text(REWARD_FILE)
    name, fn = load_reward(f"{tmp_path / 'my_verl_reward.py'}:compute_score")
    if not _wired(fn):
        pytest.skip("grpo/rewards/__init__.py does not call grpo.rewards.verl.adapt_reward yet")
    assert name == "compute_score" and fn.__name__ == "compute_score"
    assert fn(prompts=["q"], completions=[" 4 "], reward_model=[{"ground_truth": "4"}]) == [1.0]
    monkeypatch.chdir(tmp_path)
    name, fn = load_reward("my_verl_reward.compute_score")
    assert name == "compute_score" and _wired(fn)


def test_wired_trainer_wraps_verl_callables():
    from grpo.api.inputs import resolve_rewards
    from grpo.config import build_config

    (name, fn), = resolve_rewards([compute_score], build_config())[0]
    if not _wired(fn):
        pytest.skip("grpo/api/inputs.py does not call grpo.rewards.verl.adapt_reward yet")
    assert name == "compute_score"
    assert fn(prompts=["q"], completions=["x4"], reward_model=[{"ground_truth": "4"}]) == [1.0]
    (name, fn), = resolve_rewards([("gsm8k", compute_score)], build_config())[0]
    assert name == "gsm8k" and _wired(fn)
