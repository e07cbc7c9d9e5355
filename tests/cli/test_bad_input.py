"""Bad input never crashes with a traceback and never damages a run: one line naming the file / line /
key / function, exit code 2, and an existing output directory left byte for byte as it was."""

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.cli.main import main
from tests.run_helpers import ROOT, cli_argv, make_micro_dir, make_reward, records, run_in_process, tiny_config


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The micro model, a reward, broken inputs of every kind, and a used output directory."""
    root = tmp_path_factory.mktemp("bad")
    micro = make_micro_dir(root / "micro")
    files = {"micro": micro, "reward": make_reward(root), "root": root}
    broken = {
        "syntax.py": "def f(prompts, completions, **kw)\n    return []\n",
        "imports.py": "import no_such_module_for_grpo\n",
        "nofn.py": "def g(prompts, completions, **kw):\n    return [0.0] * len(completions)\n",
        "bad.yaml": "train:\n  max_steps: [1\n",
        "list.yaml": "- train\n",
        "section.yaml": "train: 5\n",
        "unknown.yaml": "trainer:\n  max_steps: 1\n",
        "invalid_json.jsonl": '{"prompt": "1+1="}\n{"prompt": "2+2=",\n',
        "not_object.jsonl": '["1+1="]\n',
        "no_column.jsonl": '{"question": "1+1="}\n',
        "missing_prompt.jsonl": '{"prompt": "1+1="}\n{"answer": "4"}\n',
        "empty_prompt.jsonl": '{"prompt": ""}\n',
        "blank_prompt.jsonl": '{"prompt": "1+1="}\n{"prompt": "   "}\n',
        "int_prompt.jsonl": '{"prompt": 7}\n',
        "bad_message.jsonl": '{"prompt": [{"content": "hi"}]}\n',
        "mixed.jsonl": '{"prompt": "1+1="}\n{"prompt": [{"role": "user", "content": "hi"}]}\n',
        "chat.jsonl": '{"prompt": [{"role": "user", "content": "hi"}]}\n',
        "empty.jsonl": "\n\n",
        "prompts.txt": "1+1=\n",
        "no_prompt.csv": "question,answer\n1+1=,2\n",
        "all_bad.jsonl": "{oops\n[1]\n",
        "a_file": "not a directory\n",
    }
    for name, text in broken.items():
        (root / name).write_text(text)
    (root / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    (root / "no_config").mkdir()
    notok = make_micro_dir(root / "no_tokenizer")
    for p in notok.iterdir():
        if "token" in p.name:
            p.unlink()
    garbled = make_micro_dir(root / "garbled")
    (garbled / "model.safetensors").write_bytes(b"\x00" * 64)
    (root / "not_a_checkpoint").mkdir()
    used = root / "used"
    run_in_process(tiny_config(micro, files["reward"], used, **{"train.max_steps": 2}))
    files["used"] = used
    return files


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# (case id, overrides of the tiny config (None = drop the key), extra argv, expected message; {root} = the files dir)
CASES = [
    # configuration keys and values
    ("unknown key", {}, ["--algorithm.betta", "0.1"], "unknown config key 'algorithm.betta' (did you mean "
     "'algorithm.beta'?); keys of section algorithm: algorithm.preset,"),
    ("unknown section in YAML", {}, ["--config", "{root}/unknown.yaml"], "unknown config key 'trainer'"),
    ("int key given text", {"train.max_steps": "abc"}, [], "config key 'train.max_steps' expects an integer, got 'abc'"),
    ("bool key given text", {"data.shuffle": "maybe"}, [], "config key 'data.shuffle' expects true/false, got 'maybe'"),
    ("float key given text", {"optim.lr": "fast"}, [], "config key 'optim.lr' expects a number, got 'fast'"),
    ("mapping key given a number", {"data.column_map": 3}, [], "config key 'data.column_map' expects a mapping"),
    ("empty required key", {"train.resume": ""}, [], "config key 'train.resume' may not be empty"),
    ("value out of range", {"rollout.num_generations": 1}, [], "rollout.num_generations must be >= 2"),
    ("unknown registry name", {"algorithm.loss_agg_mode": "foo"}, [], "algorithm.loss_agg_mode must be one of"),
    ("negative max_bad_steps", {"train.max_bad_steps": -1}, [], "train.max_bad_steps must be >= 0"),
    ("invalid YAML names file and line", {}, ["--config", "{root}/bad.yaml"], "{root}/bad.yaml:3: invalid YAML"),
    ("YAML top level not a mapping", {}, ["--config", "{root}/list.yaml"], "the top level must be a mapping of sections"),
    ("YAML section not a mapping", {}, ["--config", "{root}/section.yaml"], "config section 'train' must be a mapping"),
    ("config file missing", {}, ["--config", "{root}/absent.yaml"], "config file not found: {root}/absent.yaml"),
    ("flag with a bad value", {}, ["--max-steps", "abc"], "argument --max-steps: invalid int value: 'abc'"),
    ("stray argument", {}, ["stray"], "unrecognised argument 'stray'"),
    ("key without a value", {}, ["--optim.lr"], "config key 'optim.lr' needs a value"),
    ("infinite lr", {"optim.lr": "inf"}, [], "config key 'optim.lr' must be a finite number, got inf"),
    ("NaN reward weight", {"reward.weights": ["nan"]}, [], "config key 'reward.weights' must be a finite number, got nan"),
    ("metrics file outside the run", {"log.metrics_file": "../metrics.jsonl"}, [],
     "log.metrics_file must be a plain file name inside train.output_dir, got '../metrics.jsonl'"),
    # the model directory
    ("missing model directory", {"model.path": "{root}/absent-model"}, [], "policy directory not found: {root}/absent-model"),
    ("model directory without config.json", {"model.path": "{root}/no_config"}, [],
     "not a Hugging Face model directory (no config.json): {root}/no_config"),
    ("model directory without tokenizer", {"model.path": "{root}/no_tokenizer"}, [], "no tokenizer files"),
    ("model weights unreadable", {"model.path": "{root}/garbled"}, [], "cannot load a causal LM from {root}/garbled"),
    # reward functions
    ("reward file missing", {"reward.functions": ["{root}/absent.py:f"]}, [], "reward file not found: {root}/absent.py"),
    ("reward file with a syntax error", {"reward.functions": ["{root}/syntax.py:f"]}, [],
     "reward file {root}/syntax.py failed to import: SyntaxError"),
    ("reward file importing a missing module", {"reward.functions": ["{root}/imports.py:f"]}, [],
     "reward file {root}/imports.py failed to import: ModuleNotFoundError: No module named 'no_such_module_for_grpo'"),
    ("reward function missing", {"reward.functions": ["{root}/nofn.py:f"]}, [], "reward file {root}/nofn.py has no function 'f'"),
    ("unknown reward name", {"reward.functions": ["bogus"]}, [], "unknown reward 'bogus'"),
    ("unknown reward parameter", {"reward.functions": ["cosine_length:maxlen=3"]}, [],
     "reward 'cosine_length' has no parameter 'maxlen'"),
    # dataset rows
    ("invalid JSON names file:line", {"data.dataset": "{root}/invalid_json.jsonl"}, [],
     "{root}/invalid_json.jsonl:2: invalid JSON"),
    ("row not an object", {"data.dataset": "{root}/not_object.jsonl"}, [],
     "{root}/not_object.jsonl:1: expected a JSON object per line, got list"),
    ("no prompt column", {"data.dataset": "{root}/no_column.jsonl"}, [], "{root}/no_column.jsonl: no column 'prompt'"),
    ("row without the prompt", {"data.dataset": "{root}/missing_prompt.jsonl"}, [],
     "{root}/missing_prompt.jsonl:2: column 'prompt' must be a non-empty string"),
    ("empty prompt", {"data.dataset": "{root}/empty_prompt.jsonl"}, [], "{root}/empty_prompt.jsonl:1: column 'prompt' must be"),
    ("blank prompt", {"data.dataset": "{root}/blank_prompt.jsonl"}, [], "{root}/blank_prompt.jsonl:2: column 'prompt' must be"),
    ("prompt of the wrong type", {"data.dataset": "{root}/int_prompt.jsonl"}, [], "got int"),
    ("chat message without a role", {"data.dataset": "{root}/bad_message.jsonl"}, [],
     "{root}/bad_message.jsonl:1: column 'prompt' message 0 must be an object with string 'role' and 'content'"),
    ("two prompt formats", {"data.dataset": "{root}/mixed.jsonl"}, [],
     "{root}/mixed.jsonl:2: prompt is a list of messages but earlier prompts are a string"),
    ("chat prompts without a chat template", {"data.dataset": "{root}/chat.jsonl"}, [],
     "prompts are chat messages but the tokenizer has no chat template"),
    ("empty dataset", {"data.dataset": "{root}/empty.jsonl"}, [], "{root}/empty.jsonl: no rows"),
    ("dataset missing", {"data.dataset": "{root}/absent.jsonl"}, [], "dataset file not found: {root}/absent.jsonl"),
    ("unsupported dataset format", {"data.dataset": "{root}/prompts.txt"}, [], "unsupported dataset format '.txt'"),
    ("dataset not UTF-8", {"data.dataset": "{root}/latin1.jsonl"}, [], "{root}/latin1.jsonl: not UTF-8 text"),
    ("CSV without the prompt column", {"data.dataset": "{root}/no_prompt.csv"}, [], "{root}/no_prompt.csv: no column 'prompt'"),
    ("column_map names a missing column",
     {"data.dataset": "{root}/missing_prompt.jsonl", "data.column_map": {"q": "prompt"}}, [],
     "data.column_map names column 'q'"),
    ("skip_bad_rows with no good row", {"data.dataset": "{root}/all_bad.jsonl", "data.skip_bad_rows": True}, [],
     "{root}/all_bad.jsonl: no rows (2 bad, first: {root}/all_bad.jsonl:1: invalid JSON"),
    # the output directory
    ("output directory is a file", {"train.output_dir": "{root}/a_file"}, [],
     "train.output_dir {root}/a_file is not a writable directory (File exists)"),
    ("output directory under a file", {"train.output_dir": "{root}/a_file/run"}, [],
     "train.output_dir {root}/a_file/run is not a writable directory (Not a directory)"),
    ("output directory not writable", {"train.output_dir": "/sys/grpo-run"}, [],
     "train.output_dir /sys/grpo-run is not a writable directory"),
    # resuming
    ("resume path missing", {}, ["--resume", "{root}/used/checkpoint-9"],
     "checkpoint directory not found: {root}/used/checkpoint-9"),
    ("resume path not a checkpoint", {}, ["--resume", "{root}/not_a_checkpoint"], "not_a_checkpoint: no manifest.json"),
    ("resume past max_steps", {"train.max_steps": 1}, ["--resume"], "checkpoint-2 is at step 2, past train.max_steps=1"),
    ("resume with a change that cannot apply", {"lora.enabled": True}, ["--resume"],
     "cannot resume checkpoint-2 with a changed lora.enabled (False -> True): the checkpoint holds full weights"),
]


@pytest.mark.parametrize("overrides,extra,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_damages_nothing(world, overrides, extra, message, capsys):
    root = str(world["root"])
    fill = lambda v: json.loads(json.dumps(v).replace("{root}", root))  # noqa: E731
    flat = tiny_config(world["micro"], world["reward"], world["used"], **{"train.max_steps": 2})
    flat.update(fill(overrides))
    before = _snapshot(world["used"])
    capsys.readouterr()
    try:
        code = main(cli_argv(flat, *fill(extra)))
    except SystemExit as e:           # argparse's own errors
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert message.replace("{root}", root) in err
    assert _snapshot(world["used"]) == before


def test_the_cases_cover_every_kind_of_bad_input():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


def test_debug_shows_the_traceback(world, capsys):
    flat = tiny_config(world["micro"], world["reward"], world["used"], **{"train.max_steps": 2})
    assert main(["--debug", *cli_argv(flat, "--algorithm.betta", "1")]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ConfigError: unknown config key 'algorithm.betta'" in err
    assert err.strip().splitlines()[-1].startswith("error: unknown config key 'algorithm.betta'")


def test_bad_input_in_a_real_process(world):
    """The console entry point: exit status 2 and only the error line on stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "grpo", "train", "--config", str(world["root"] / "bad.yaml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {world['root'] / 'bad.yaml'}:3: invalid YAML (")
    assert proc.stderr.count("\n") == 1


def test_skip_bad_rows_trains_on_the_good_ones_and_counts_the_rest(world, tmp_path, caplog):
    data = tmp_path / "mixed_quality.jsonl"
    good = [json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) for a in range(5)]
    data.write_text("\n".join([good[0], "{broken", good[1], '{"prompt": ""}', good[2], '{"answer": "1"}', good[3],
                               "[1, 2]", good[4], '{"prompt": 3}']) + "\n")
    flat = tiny_config(world["micro"], world["reward"], tmp_path / "run",
                       **{"train.max_steps": 1, "data.dataset": str(data), "data.skip_bad_rows": True})
    with caplog.at_level(logging.WARNING):
        run_in_process(flat)
    message = next(r.getMessage() for r in caplog.records if "skip_bad_rows" in r.getMessage())
    assert message == (f"warning: data.skip_bad_rows: skipped 5 of 10 rows of {data} "
                       f"(first: {data}:2: invalid JSON (Expecting property name enclosed in double quotes))")
    assert records(tmp_path / "run")[0]["data/skipped_rows"] == 5
