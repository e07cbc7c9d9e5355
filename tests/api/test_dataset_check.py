"""grpo.api.dataset_check: the prompt-column check on column names, for in-memory rows and each file format,
and grpo.Trainer(...) refusing a dataset without a prompt column before it loads the model."""

import json

import pytest

import grpo
from grpo.api.dataset_check import check_prompt_column, column_names
from grpo.config import build_config
from grpo.data.datasets_io import DataError, records_from_rows


def data(**keys):
    return build_config(None, {f"data.{k}": v for k, v in keys.items()}).data


def accuracy(completions, **kwargs):
    return [0.0 for _ in completions]


def test_trainer_refuses_rows_without_a_prompt_column_before_loading_the_model(tmp_path):
    with pytest.raises(DataError) as e:
        grpo.Trainer(str(tmp_path / "no-model-here"), reward_funcs=[accuracy], train_dataset=[{"q": "x"}])
    assert str(e.value) == ("train_dataset: no column 'prompt' (set data.column_map (e.g. {question: prompt}) or "
                            "data.prompt_column); columns: q")


def test_trainer_refuses_a_dataset_file_without_the_prompt_column(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "1+1=", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"d.jsonl: no column 'prompt' .*; columns: question, answer$"):
        grpo.Trainer(str(tmp_path / "no-model-here"), reward_funcs=[accuracy], train_dataset=str(path))
    with pytest.raises(DataError, match=r"^dataset file not found: .*missing.jsonl$"):
        grpo.Trainer(str(tmp_path / "no-model-here"), reward_funcs=[accuracy],
                     train_dataset=str(tmp_path / "missing.jsonl"))


def test_column_map_and_prompt_column_are_applied_to_the_names():
    rec = records_from_rows([{"question": "1+1=", "answer": "2"}])
    check_prompt_column(data(column_map={"question": "prompt"}), rec)
    check_prompt_column(data(prompt_column="question"), rec)
    with pytest.raises(DataError, match=r"no column 'query' \(data.prompt_column\); columns: question, answer"):
        check_prompt_column(data(prompt_column="query"), rec)
    with pytest.raises(DataError, match="data.column_map names column 'q', which the dataset does not have"):
        check_prompt_column(data(column_map={"q": "prompt"}), rec)


def test_column_names_of_each_file_format(tmp_path):
    from datasets import Dataset, DatasetDict

    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    (tmp_path / "d.csv").write_text("prompt,answer\na,1\n")
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "flat"))
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    (tmp_path / "d.json").write_text(json.dumps(rows))
    assert column_names(tmp_path / "d.parquet", "train") == (str(tmp_path / "d.parquet"), ["prompt", "answer"])
    assert column_names(tmp_path / "d.csv", "train")[1] == ["prompt", "answer"]
    assert column_names(tmp_path / "flat", "train")[1] == ["prompt", "answer"]
    assert column_names(tmp_path / "dd", "train") == (f"{tmp_path / 'dd'}[train]", ["prompt", "answer"])
    assert column_names(tmp_path / "dd", "test")[1] is None           # train() names the missing split
    assert column_names(tmp_path / "d.json", "train")[1] is None      # read at train()


def test_a_jsonl_file_whose_first_row_lacks_the_column_is_judged_on_every_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('\n{"note": "header"}\n{"prompt": "1+1="}\n')
    check_prompt_column(data(dataset=str(path)), None)            # a later row has it: train() checks the rows
    path.write_text('{"q": "a"}\n{"r": "b"}\n')
    with pytest.raises(DataError, match="no column 'prompt' .*; columns: q, r$"):
        check_prompt_column(data(dataset=str(path)), None)


def test_the_embedded_task_needs_no_check():
    assert check_prompt_column(data(), None) is None
