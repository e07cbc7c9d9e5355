import pytest
import torch

from grpo.config import DataConfig
from grpo.data import DataError, PromptStream, load_prompt_rows, read_jsonl, tokenize_prompts
from grpo.models import build_tokenizer


def test_jsonl_rows_and_line_numbered_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+2=", "answer": "3"}\n\n{"prompt": "4-1=", "answer": "3"}\n')
    assert [r["answer"] for r in read_jsonl(f)] == ["3", "3"]
    cases = {'{"prompt": "a"}\n{"prompt": \n': r"bad.jsonl:2: invalid JSON",
             '{"question": "a"}\n': r"bad.jsonl:1: column 'prompt' must be a non-empty string",
             '{"prompt": ""}\n': r"bad.jsonl:1: column 'prompt'",
             '{"prompt": 5}\n': r"bad.jsonl:1: column 'prompt'",
             '[1, 2]\n': r"bad.jsonl:1: expected a JSON object"}
    for text, message in cases.items():
        (tmp_path / "bad.jsonl").write_text(text)
        with pytest.raises(DataError, match=message):
            read_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="dataset file not found"):
        read_jsonl(tmp_path / "none.jsonl")


def test_prompt_column_mapping(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"question": "1+2=", "answer": "3"}\n')
    rows = load_prompt_rows(DataConfig(dataset=str(f), prompt_column="question"))
    assert rows[0]["prompt"] == "1+2=" and rows[0]["answer"] == "3"


def test_embedded_task_rows_and_seeded_epochs():
    rows = load_prompt_rows(DataConfig(num_train_prompts=10))
    assert len(rows) == 10 and {"prompt", "answer"} <= set(rows[0])
    a, b = PromptStream(rows, seed=3), PromptStream(rows, seed=3)
    first = a.next(10)
    assert first == b.next(10)                                  # same seed, same order
    assert sorted(r["prompt"] for r in first) == sorted(r["prompt"] for r in rows)  # one full epoch
    assert a.next(4) and a.epoch == 2


def test_tokenize_left_pads_and_keeps_columns():
    tok = build_tokenizer()
    batch = tokenize_prompts(tok, [{"prompt": "12+3=", "answer": "15"}, {"prompt": "1+2=", "answer": "3"}])
    assert batch.prompt_ids.shape == (2, 5)
    assert batch.prompt_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert batch.prompt_ids[1, 0] == tok.pad_token_id
    assert batch.columns == {"answer": ["15", "3"]}
    assert tok.decode(batch.prompt_ids[1, 1:]) == "1+2="
