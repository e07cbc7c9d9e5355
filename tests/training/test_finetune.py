"""grpo/training/finetune.py and `grpo sft --dataset`: any model and dataset, completion-only loss,
the shared schedule and checkpoints, exact resume, one-line errors."""

import json

import pytest
import torch
from safetensors.torch import load_file

from grpo.config import ConfigError
from grpo.modeling.models import build_tokenizer
from grpo.training.finetune import IGNORE_INDEX, batch_of, encode_rows, next_batch, split_row
from tests.run_helpers import make_micro_dir


def test_rows_become_prompt_and_completion_with_the_loss_on_the_completion_only():
    tok = build_tokenizer()
    assert split_row({"prompt": "1+2=", "completion": "3"}, "r") == ("1+2=", "3")
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                         {"role": "user", "content": "again"}, {"role": "assistant", "content": "b"}]}
    assert split_row(chat, "r") == (chat["messages"][:3], "b")                 # the last assistant turn is learned
    pairs = encode_rows(tok, [{"prompt": "1+2=", "completion": "3"}, {"prompt": "10+20=", "completion": "30"}])
    assert pairs[0] == (tok("1+2=", add_special_tokens=False)["input_ids"],
                        tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    batch = batch_of(pairs, tok.pad_token_id)
    labels = batch["labels"]
    assert (labels[0, :4] == IGNORE_INDEX).all() and labels[0, 4:6].tolist() == pairs[0][1]
    assert (labels[0, 6:] == IGNORE_INDEX).all() and int(batch["attention_mask"][0].sum()) == 6
    for row, message in [({"prompt": "x"}, "dataset row 1: an SFT row needs 'prompt' and 'completion'"),
                         ({"messages": [{"role": "user", "content": "x"}]}, "has no assistant message")]:
        with pytest.raises(ConfigError, match=message):
            encode_rows(tok, [row])


def test_data_order_is_keyed_by_seed_and_position():
    """Every row once per epoch, and the batch at a position is the same however the run got there."""
    first = [i for p in range(0, 10, 5) for i in next_batch(10, 3, p, 5)]
    assert sorted(first) == list(range(10))
    assert next_batch(10, 3, 7, 6) == next_batch(10, 3, 0, 13)[7:]


def sft_argv(model, data, out, *extra):
    return ["sft", "--model", str(model), "--dataset", str(data), "--output-dir", str(out),
            "--optim.lr", "1e-2", "--train.micro_batch_size", "4", "--cpu.num_threads", "1",
            "--log.progress_bar", "false", *extra]


def test_sft_lowers_the_loss_checkpoints_and_resumes_exactly(tmp_path, capsys):
    from grpo.cli.main import main

    model = make_micro_dir(tmp_path / "micro")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "completion": f"<think></think><answer>{a + 1}</answer>"})
                            + "\n" for a in range(12)))
    whole = tmp_path / "whole"
    assert main(sft_argv(model, data, whole, "--max-steps", "6", "--train.save_steps", "3")) == 0
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7)) and rows[-1]["loss/sft"] < rows[0]["loss/sft"]
    assert (whole / "checkpoint-3").is_dir() and (whole / "checkpoint-6").is_dir()
    split = tmp_path / "split"
    assert main(sft_argv(model, data, split, "--max-steps", "3", "--train.save_steps", "3")) == 0
    assert main(sft_argv(model, data, split, "--max-steps", "6", "--train.save_steps", "3", "--resume")) == 0
    a, b = (load_file(str(d / "checkpoint-6" / "model.safetensors")) for d in (whole, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)     # bit for bit
    assert [json.loads(x)["step"] for x in (split / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    capsys.readouterr()
    assert main(sft_argv(model, bad, tmp_path / "x", "--max-steps", "1")) == 2
    assert "an SFT row needs 'prompt' and 'completion' columns, or 'messages'" in capsys.readouterr().err


def test_sft_with_lora_trains_and_saves_the_adapter(tmp_path):
    from grpo.cli.main import main

    model = make_micro_dir(tmp_path / "micro")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "completion": str(a + 1)}) + "\n" for a in range(8)))
    out = tmp_path / "lora"
    assert main(sft_argv(model, data, out, "--max-steps", "2", "--lora.enabled", "true")) == 0
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()
    assert main(sft_argv(model, data, out, "--max-steps", "3", "--lora.enabled", "true", "--resume")) == 0
    adapter = load_file(str(out / "checkpoint-3" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
