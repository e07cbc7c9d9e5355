import json
import logging

import pytest
import torch
from datasets import Dataset, DatasetDict

from grpo.config import ConfigError, DataConfig, build_config
from grpo.data.prompts import (IDS_KEY, DataError, PromptStream, load_prompt_rows, load_prompts, read_jsonl,
                       render_prompt, tokenize_prompts)
from grpo.modeling.models import build_tokenizer

# Only characters of the embedded character-level vocabulary, so decode(encode(text)) == text.
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
RECORDS = [{"prompt": "1+2=", "answer": "3", "level": "1"}, {"prompt": "14-1=", "answer": "13", "level": "2"}]
CHAT = [{"prompt": [{"role": "user", "content": "1+2="}], "answer": "3"},
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "4-1="}], "answer": "3"}]


def chat_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def write(tmp_path, fmt: str, records: list[dict], name: str = "data"):
    """`records` as a dataset of format `fmt`; returns the path."""
    if fmt == "jsonl":
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "json":
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(records))
    elif fmt == "csv":
        path = tmp_path / f"{name}.csv"
        keys = list(records[0])
        path.write_text(",".join(keys) + "\n" + "".join(",".join(f'"{r[k]}"' for k in keys) + "\n" for r in records))
    elif fmt == "parquet":
        path = tmp_path / f"{name}.parquet"
        Dataset.from_list(records).to_parquet(str(path))
    elif fmt == "disk":
        path = tmp_path / name
        Dataset.from_list(records).save_to_disk(str(path))
    else:
        raise ValueError(fmt)
    return path


def ids_text(tok, row) -> str:
    return tok.decode(row[IDS_KEY])


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "disk"])
def test_every_format_loads_rows_columns_and_ids(tmp_path, fmt):
    tok = build_tokenizer()
    ps = load_prompts(DataConfig(dataset=str(write(tmp_path, fmt, RECORDS))), tokenizer=tok)
    assert [r["prompt"] for r in ps.rows] == ["1+2=", "14-1="]
    assert [r["answer"] for r in ps.rows] == ["3", "13"]       # CSV cells stay strings
    assert [ids_text(tok, r) for r in ps.rows] == ["1+2=", "14-1="]
    assert not ps.conversational and (ps.num_dropped, ps.num_truncated) == (0, 0)
    batch = tokenize_prompts(tok, ps.rows)
    assert batch.columns == {"answer": ["3", "13"], "level": ["1", "2"]}
    assert batch.prompt_mask.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert batch.prompt_ids[0, 0] == tok.pad_token_id and tok.decode(batch.prompt_ids[0, 1:]) == "1+2="
    assert batch.prompts == ["1+2=", "14-1="]


def test_dataset_dict_directory_uses_the_split(tmp_path):
    path = tmp_path / "dd"
    DatasetDict({"train": Dataset.from_list(RECORDS), "test": Dataset.from_list(RECORDS[:1])}).save_to_disk(str(path))
    assert len(load_prompt_rows(DataConfig(dataset=str(path)))) == 2
    rows = load_prompt_rows(DataConfig(dataset=str(path), split="test"))
    assert rows == [RECORDS[0]]
    with pytest.raises(DataError, match=r"dd: no split 'validation' \(data.split\); splits: train, test"):
        load_prompt_rows(DataConfig(dataset=str(path), split="validation"))


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


def test_loader_errors_name_file_line_row_and_columns(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n\n{"prompt": "b"\n')
    with pytest.raises(DataError, match=r"bad.jsonl:3: invalid JSON"):
        load_prompt_rows(DataConfig(dataset=str(bad)))
    bad.write_text('{"prompt": "a"}\n{"prompt": ""}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: column 'prompt' must be a non-empty string"):
        load_prompt_rows(DataConfig(dataset=str(bad)))
    with pytest.raises(DataError, match=r"dataset file not found: .*none.parquet"):
        load_prompt_rows(DataConfig(dataset=str(tmp_path / "none.parquet")))
    q = write(tmp_path, "parquet", [{"question": "1+2=", "answer": "3"}], "q")
    with pytest.raises(DataError, match=r"q.parquet: no column 'prompt' .*; columns: question, answer"):
        load_prompt_rows(DataConfig(dataset=str(q)))
    with pytest.raises(DataError, match=r"q.parquet: no column 'query' \(data.prompt_column\); columns: question, answer"):
        load_prompt_rows(DataConfig(dataset=str(q), prompt_column="query"))
    csv = tmp_path / "e.csv"
    csv.write_text("prompt,answer\n1+2=,3\n,4\n")
    with pytest.raises(DataError, match=r"e.csv: row 1: column 'prompt' must be a non-empty string .* got NoneType"):
        load_prompt_rows(DataConfig(dataset=str(csv)))
    csv.write_text('prompt,answer\n"1+2=",3\n2+2=,4,extra\n')          # a cell too many: pandas would shift it
    with pytest.raises(DataError, match=r"e.csv:3: 3 cells where the header has 2 \(prompt, answer\)"):
        load_prompt_rows(DataConfig(dataset=str(csv)))
    (tmp_path / "x.txt").write_text("1+2=\n")
    with pytest.raises(DataError, match=r"x.txt: unsupported dataset format '.txt'"):
        load_prompt_rows(DataConfig(dataset=str(tmp_path / "x.txt")))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match=r"empty_dir: not a dataset directory"):
        load_prompt_rows(DataConfig(dataset=str(tmp_path / "empty_dir")))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"empty.jsonl: no rows"):
        load_prompt_rows(DataConfig(dataset=str(tmp_path / "empty.jsonl")))


def test_message_errors_and_mixed_formats(tmp_path):
    f = write(tmp_path, "jsonl", [{"prompt": [{"role": "user", "content": "a"}, {"role": "user"}]}], "m")
    with pytest.raises(DataError, match=r"m.jsonl:1: column 'prompt' message 1 must be an object with string"):
        load_prompt_rows(DataConfig(dataset=str(f)), tokenizer=chat_tokenizer())
    f = write(tmp_path, "jsonl", [{"prompt": "a"}, {"prompt": [{"role": "user", "content": "b"}]}], "mix")
    with pytest.raises(DataError, match=r"mix.jsonl:2: prompt is a list of messages but earlier prompts are a string"):
        load_prompt_rows(DataConfig(dataset=str(f)), tokenizer=chat_tokenizer())


def test_prompt_column_alias_keeps_the_original_column(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"question": "1+2=", "answer": "3"}\n')
    rows = load_prompt_rows(DataConfig(dataset=str(f), prompt_column="question"))
    assert rows == [{"question": "1+2=", "answer": "3", "prompt": "1+2="}]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_column_map_renames_before_use_and_extra_columns_reach_rewards(tmp_path, fmt):
    f = write(tmp_path, fmt, [{"question": "1+2=", "solution": "3", "source": "gsm"}])
    ps = load_prompts(DataConfig(dataset=str(f), column_map={"question": "prompt", "solution": "answer"}),
                      tokenizer=build_tokenizer())
    batch = tokenize_prompts(build_tokenizer(), ps.rows)
    assert batch.prompts == ["1+2="]
    assert batch.columns == {"answer": ["3"], "source": ["gsm"]}


def test_column_map_errors(tmp_path):
    f = write(tmp_path, "jsonl", [{"question": "1+2=", "prompt": "x", "answer": "3"}])
    with pytest.raises(DataError, match=r"data.column_map names column 'query', which the dataset does not have "
                                         r"\(columns: question, prompt, answer\)"):
        load_prompt_rows(DataConfig(dataset=str(f), column_map={"query": "prompt"}))
    with pytest.raises(DataError, match=r"renames a column to 'prompt', but the dataset already has a 'prompt' column"):
        load_prompt_rows(DataConfig(dataset=str(f), column_map={"question": "prompt"}))
    swapped = load_prompt_rows(DataConfig(dataset=str(f), column_map={"question": "prompt", "prompt": "draft"}))
    assert swapped == [{"prompt": "1+2=", "draft": "x", "answer": "3"}]


def test_conversational_prompts_render_with_the_chat_template(tmp_path):
    tok = chat_tokenizer()
    ps = load_prompts(DataConfig(dataset=str(write(tmp_path, "jsonl", CHAT))), tokenizer=tok)
    assert ps.conversational
    assert [ids_text(tok, r) for r in ps.rows] == ["user: 1+2=\nassistant:",
                                                   "system: be brief\nuser: 4-1=\nassistant:"]
    batch = tokenize_prompts(tok, ps.rows)
    assert batch.prompts == [c["prompt"] for c in CHAT]          # rewards get the raw messages
    assert batch.columns == {"answer": ["3", "3"]}


def test_conversational_save_to_disk_and_system_prompt(tmp_path):
    tok = chat_tokenizer()
    cfg = DataConfig(dataset=str(write(tmp_path, "disk", CHAT)), system_prompt="think")
    rows = load_prompt_rows(cfg, tokenizer=tok)
    assert [ids_text(tok, r) for r in rows] == ["system: think\nuser: 1+2=\nassistant:",     # prepended
                                                "system: be brief\nuser: 4-1=\nassistant:"]  # already has one


def test_string_prompts_with_a_system_prompt(tmp_path):
    cfg = DataConfig(dataset=str(write(tmp_path, "jsonl", RECORDS[:1])), system_prompt="think")
    tok = chat_tokenizer()
    assert ids_text(tok, load_prompt_rows(cfg, tokenizer=tok)[0]) == "system: think\nuser: 1+2=\nassistant:"
    plain = build_tokenizer()                                   # no chat template: a text prefix
    assert ids_text(plain, load_prompt_rows(cfg, tokenizer=plain)[0]) == "think\n1+2="
    assert ids_text(tok, load_prompt_rows(DataConfig(dataset=cfg.dataset), tokenizer=tok)[0]) == "1+2="
    assert render_prompt(tok, "1+2=") == "1+2="


def test_chat_prompts_need_a_template_and_a_tokenizer(tmp_path):
    f = write(tmp_path, "jsonl", CHAT, "chat")
    with pytest.raises(DataError, match=r"chat.jsonl: prompts are chat messages but the tokenizer has no chat template"):
        load_prompts(DataConfig(dataset=str(f)), tokenizer=build_tokenizer())
    with pytest.raises(DataError, match=r"chat.jsonl: chat prompts, .* need the tokenizer"):
        load_prompts(DataConfig(dataset=str(f)))
    with pytest.raises(DataError, match="chat-message prompts must be rendered first"):
        tokenize_prompts(build_tokenizer(), CHAT)


def test_long_prompts_drop_truncate_error(tmp_path, caplog):
    f = write(tmp_path, "jsonl", [{"prompt": "1+2="}, {"prompt": "12+34-5="}, {"prompt": "9="}], "long")
    tok = build_tokenizer()
    with caplog.at_level(logging.WARNING, logger="grpo.data.prompts"):
        ps = load_prompts(DataConfig(dataset=str(f), max_prompt_length=4), tokenizer=tok)
    assert [r["prompt"] for r in ps.rows] == ["1+2=", "9="] and (ps.num_dropped, ps.num_truncated) == (1, 0)
    assert "long.jsonl: dropped 1 of 3 prompts longer than data.max_prompt_length=4 tokens" in caplog.text
    ps = load_prompts(DataConfig(dataset=str(f), max_prompt_length=4, long_prompts="truncate"), tokenizer=tok)
    assert (ps.num_dropped, ps.num_truncated) == (0, 1)
    assert [ids_text(tok, r) for r in ps.rows] == ["1+2=", "4-5=", "9="]  # the last 4 tokens
    assert ps.rows[1]["prompt"] == "12+34-5="                   # rewards still see the full prompt
    assert tokenize_prompts(tok, ps.rows).prompt_ids.shape == (3, 4)
    with pytest.raises(DataError, match=r"long.jsonl: 1 of 3 prompts are longer than data.max_prompt_length=4 "
                                        r"tokens \(first: .*long.jsonl:2, 8 tokens\)"):
        load_prompts(DataConfig(dataset=str(f), max_prompt_length=4, long_prompts="error"), tokenizer=tok)
    with pytest.raises(DataError, match=r"long.jsonl: all 3 prompts are longer than data.max_prompt_length=1"):
        load_prompts(DataConfig(dataset=str(f), max_prompt_length=1), tokenizer=tok)


def test_length_limit_counts_chat_template_tokens(tmp_path):
    f = write(tmp_path, "jsonl", CHAT[:1], "c")                  # "user: 1+2=\nassistant:" = 21 tokens
    tok = chat_tokenizer()
    assert len(load_prompt_rows(DataConfig(dataset=str(f), max_prompt_length=21), tokenizer=tok)) == 1
    rows = load_prompt_rows(DataConfig(dataset=str(f), max_prompt_length=12, long_prompts="truncate"), tokenizer=tok)
    assert ids_text(tok, rows[0]) == "=\nassistant:" and len(rows[0][IDS_KEY]) == 12


def test_embedded_task_rows_and_seeded_epochs():
    rows = load_prompt_rows(DataConfig(num_train_prompts=10))
    assert len(rows) == 10 and {"prompt", "answer"} <= set(rows[0])
    a, b = PromptStream(rows, seed=3), PromptStream(rows, seed=3)
    first = a.next(10)
    assert first == b.next(10)                                  # same seed, same order
    assert sorted(r["prompt"] for r in first) == sorted(r["prompt"] for r in rows)  # one full epoch
    assert a.next(4) and a.epoch == 2


def test_embedded_task_pretokenized_matches_tokenizing_each_step():
    tok = build_tokenizer()
    ps = load_prompts(DataConfig(num_train_prompts=6), seed=1, tokenizer=tok)
    assert ps.source == "task 'arithmetic'" and not ps.conversational
    raw = [{k: v for k, v in r.items() if k != IDS_KEY} for r in ps.rows]
    pre, fresh = tokenize_prompts(tok, ps.rows), tokenize_prompts(tok, raw)
    assert torch.equal(pre.prompt_ids, fresh.prompt_ids) and torch.equal(pre.prompt_mask, fresh.prompt_mask)
    assert pre.columns == fresh.columns and set(pre.columns) == {"answer"}


def test_tokenize_left_pads_and_keeps_columns():
    tok = build_tokenizer()
    batch = tokenize_prompts(tok, [{"prompt": "12+3=", "answer": "15"}, {"prompt": "1+2=", "answer": "3"}])
    assert batch.prompt_ids.shape == (2, 5)
    assert batch.prompt_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert batch.prompt_ids[1, 0] == tok.pad_token_id
    assert batch.columns == {"answer": ["15", "3"]}
    assert tok.decode(batch.prompt_ids[1, 1:]) == "1+2="


def test_data_config_keys_are_coerced_and_validated():
    cfg = build_config({"data": {"column_map": {"question": "prompt", 1: 2}, "max_prompt_length": 64.0,
                                 "long_prompts": "truncate", "system_prompt": "think"}})
    assert cfg.data.column_map == {"question": "prompt", "1": "2"} and cfg.data.max_prompt_length == 64
    assert DataConfig().column_map == {} and DataConfig().long_prompts == "drop" and DataConfig().split == "train"
    bad = {"data.column_map": (["question"], "config key 'data.column_map' expects a mapping"),
           "data.long_prompts": ("cut", "data.long_prompts must be drop | truncate | error"),
           "data.max_prompt_length": (-1, "data.max_prompt_length must be >= 0"),
           "data.split": ("", "data.split may not be empty")}
    for key, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=message):
            build_config(overrides={key: value})
    with pytest.raises(ConfigError, match="data.column_map may not map two columns onto the same name"):
        build_config(overrides={"data.column_map": {"a": "prompt", "b": "prompt"}})
    with pytest.raises(ConfigError, match="data.prompt_column and data.column_map both choose the prompt column"):
        build_config(overrides={"data.column_map": {"a": "prompt"}, "data.prompt_column": "b"})


def test_tools_are_rendered_through_the_chat_template(tmp_path):
    """A multi-turn environment's tools reach the template as JSON schemas (built from docstrings and hints)."""
    from grpo.envs import calc

    tok = build_tokenizer()
    tok.chat_template = ("{% if tools %}tools: {% for t in tools %}{{ t['function']['name'] }}("
                         "{{ t['function']['parameters']['properties'] | list | join(',') }}){% endfor %}\n{% endif %}"
                         + TEMPLATE)
    ps = load_prompts(DataConfig(dataset=str(write(tmp_path, "jsonl", CHAT[:1]))), tokenizer=tok, tools=[calc])
    assert ids_text(tok, ps.rows[0]) == "tools: calc(expression)user: 1+2=\nassistant:"   # trim_blocks eats the \\n
    plain = load_prompts(DataConfig(dataset=str(write(tmp_path, "jsonl", CHAT[:1], name="b"))), tokenizer=tok)
    assert ids_text(tok, plain.rows[0]) == "user: 1+2=\nassistant:"


def test_chat_template_kwargs_reach_the_template(tmp_path):
    """data.chat_template_kwargs (TRL's chat_template_kwargs, e.g. Qwen3's enable_thinking) go to every render."""
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE.replace("assistant:", "assistant:{% if enable_thinking is defined and not "
                                                       "enable_thinking %}<think></think>{% endif %}")
    path = write(tmp_path, "jsonl", CHAT)
    plain = load_prompts(DataConfig(dataset=str(path)), tokenizer=tok)
    off = load_prompts(DataConfig(dataset=str(path), chat_template_kwargs={"enable_thinking": False}), tokenizer=tok)
    assert ids_text(tok, plain.rows[0]) == "user: 1+2=\nassistant:"
    assert ids_text(tok, off.rows[0]) == "user: 1+2=\nassistant:<think></think>"
    assert render_prompt(tok, "1+2=", "be brief", template_kwargs={"enable_thinking": False}).endswith("<think></think>")
