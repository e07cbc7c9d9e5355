import json
import subprocess
import sys

import pytest
import torch

from grpo.cli.common import parse_overrides
from grpo.cli.main import main
from grpo.config import ConfigError
from grpo.modeling.models import build_model, build_tokenizer, load_policy


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("micro")
    tok = build_tokenizer()
    build_model(tok, "micro", seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_parse_overrides():
    assert parse_overrides(["--algorithm.beta", "0", "--reward.functions=[a, b]", "--train.output_dir", "x/y"]) == {
        "algorithm.beta": 0, "reward.functions": ["a", "b"], "train.output_dir": "x/y"}


def test_parse_overrides_takes_trl_names_for_grpo_train():
    """TRL's flag spellings (underscores or hyphens, `--name=value`, a bare boolean) under their TRL names
    (values read as TRL's parser reads them: 1e-6 a float)."""
    argv = ["--learning_rate", "1e-6", "--num-generations=4", "--use_peft", "--lora_r", "8", "--bf16", "--beta", "-0.5"]
    assert parse_overrides(argv, trl=True) == {"learning_rate": 1e-6, "num_generations": 4, "use_peft": True,
                                               "lora_r": 8, "bf16": True, "beta": -0.5}
    with pytest.raises(ConfigError, match="TRL's learning_rate is --optim.lr here"):
        parse_overrides(argv)
    with pytest.raises(ConfigError, match="unrecognised argument '--logging_stepz'"):
        parse_overrides(["--logging_stepz", "1"], trl=True)
    with pytest.raises(ConfigError, match="^unrecognised argument '--eval-on-start': 'eval_on_start' is a TRL / "
                                          "transformers TrainingArguments key grpo does not map"):
        parse_overrides(["--eval-on-start", "true"], trl=True)       # a field grpo has no counterpart for


def test_train_two_steps_through_the_cli(micro_dir, tmp_path):
    reward_file = tmp_path / "r.py"
    # a reward that varies within every group, so advantages (and gradients) are non-zero
    reward_file.write_text("def digits(prompts, completions, **kw):\n"
                           "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    out = tmp_path / "run"
    code = main(["train", "--model", str(micro_dir), "--reward", f"{reward_file}:digits", "--reward", "format",
                 "--output-dir", str(out), "--max-steps", "2", "--seed", "1",
                 "--train.prompts_per_step", "2", "--rollout.num_generations", "4", "--rollout.max_new_tokens", "8",
                 "--optim.lr", "1e-2", "--data.num_train_prompts", "50", "--log.progress_bar", "false"])
    assert code == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in ("reward/total/mean", "reward/digits/mean", "reward/format/std", "completion/length_mean",
                "completion/truncated_frac", "advantages/zero_std_frac", "policy/clip_frac", "kl/mean",
                "policy/entropy", "loss/policy", "optim/grad_norm", "optim/lr", "time/step_s", "rollout/tokens_per_s"):
        assert key in records[0], key
    assert records[0]["optim/grad_norm"] > 0
    before, _ = load_policy(micro_dir)
    after, _ = load_policy(out / "checkpoint-2")
    changed = [not torch.equal(a, b) for a, b in zip(before.parameters(), after.parameters())]
    assert all(changed)
    assert (out / "config.yaml").read_text().count("digits") == 1


@pytest.mark.parametrize("argv,message", [
    (["train", "--algorithm.betta", "0.1"],
     "unknown config key 'algorithm.betta' (did you mean 'algorithm.beta'?); keys of section algorithm: algorithm.preset,"),
    (["demo", "--learning_rate", "1e-6"], "unrecognised argument '--learning_rate' (config keys are given as --section.key "
                                          "VALUE; TRL's learning_rate is --optim.lr here)"),
    (["train", "--rollout.num_generations", "1"], "rollout.num_generations must be >= 2"),
    (["train", "--config", "/nonexistent.yaml"], "config file not found: /nonexistent.yaml"),
    (["train", "--model", "/nonexistent-model", "--max-steps", "1"], "policy directory not found: /nonexistent-model"),
    (["train", "--reward", "nope.py:f", "--max-steps", "1"], "reward file not found: nope.py"),
    (["train", "stray"], "unrecognised argument 'stray'"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys, tmp_path):
    code = main(argv + ["--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_help_config_lists_keys(capsys):
    assert main(["train", "--help-config"]) == 0
    assert "algorithm.beta" in capsys.readouterr().out


def test_module_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "grpo", "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--section.key" in out.stdout


def test_eval_on_the_embedded_task_and_on_a_dataset(micro_dir, tmp_path, capsys):
    """`grpo eval` reports each reward's mean: the task's own rewards on its held-out split; on a dataset
    the named rewards over its first N rows (its columns reach them); a dataset without --reward is the
    one-line error, exit 2."""
    assert main(["eval", "--model", str(micro_dir), "--problems", "4", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out.split()
    assert out[0::2] == ["accuracy", "format", "completion_length"]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "target": str(a + 1)}) + "\n" for a in range(5)))
    reward = tmp_path / "r.py"
    reward.write_text("def seen(completions, target, **kw):\n    return [float(len(t)) for t in target]\n")
    assert main(["eval", "--model", str(micro_dir), "--dataset", str(data), "--problems", "3",
                 "--reward", f"{reward}:seen", "--max-new-tokens", "3"]) == 0
    lines = dict(line.split() for line in capsys.readouterr().out.strip().splitlines())
    assert float(lines["seen"]) == 1.0 and float(lines["completion_length"]) <= 3
    assert main(["eval", "--model", str(micro_dir), "--dataset", str(data)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: no reward function for dataset {data}: pass --reward")


def test_eval_with_samples_gives_pass_and_maj_at_k(micro_dir, tmp_path, capsys):
    """--samples 4 --k 1,4 --maj: per-problem rows and a summary whose pass@1 is the mean correctness,
    pass@4 the unbiased estimate from each row's count, maj@k in [0, 1]; files written to --out."""
    from grpo.algorithms.sampling_metrics import pass_at_k

    out = tmp_path / "eval"
    assert main(["eval", "--model", str(micro_dir), "--problems", "3", "--samples", "4", "--k", "1,4", "--maj",
                 "--temperature", "1.0", "--max-new-tokens", "6", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert len(rows) == 3 and all(len(r["samples"]) == 4 for r in rows)
    assert summary["pass@1"] == pytest.approx(sum(r["correct"] for r in rows) / 12)
    assert summary["pass@4"] == pytest.approx(sum(pass_at_k(4, r["correct"], 4) for r in rows) / 3)
    assert 0.0 <= summary["maj@4"] <= 1.0 and set(summary) >= {"reward/accuracy", "reward/format", "completion_length"}
    assert "pass@4" in capsys.readouterr().out
    assert main(["eval", "--model", str(micro_dir), "--samples", "4"]) == 2              # greedy: all the same
    assert "--samples > 1 needs --temperature > 0" in capsys.readouterr().err
    assert main(["eval", "--model", str(micro_dir), "--samples", "2", "--k", "3", "--temperature", "1"]) == 2
    assert "--k: every k must be in 1..--samples (2)" in capsys.readouterr().err


def test_a_trl_grpo_recipe_trains_through_grpo_train(micro_dir, tmp_path, capsys, monkeypatch):
    """A `trl grpo --config` file, unchanged but for local paths, trains: model, dataset and reward by TRL's
    names (the reward an import path from the working directory), batch keys, logging and vLLM keys."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text("def digits(completions, **kwargs):\n"
                                            "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{b}="}) + "\n"
                                                    for a in range(5) for b in range(5)))
    (tmp_path / "recipe.yaml").write_text(
        f"model_name_or_path: {micro_dir}\ndataset_name: prompts.jsonl\nreward_funcs: [my_rewards.digits]\n"
        "learning_rate: 1.0e-2\nbeta: 0.0\nloss_type: dapo\nnum_generations: 4\nper_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 2\nmax_completion_length: 6\nmax_steps: 2\nlogging_steps: 1\n"
        "use_vllm: false\nreport_to: none\nbf16: false\nsave_strategy: 'no'\noutput_dir: run\n")
    assert main(["train", "--config", "recipe.yaml", "--log.progress_bar", "false", "--cpu.num_threads", "1"]) == 0
    err = capsys.readouterr().err
    assert "grpo: TRL keys mapped:" in err and "use_vllm -> rollout.engine" in err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and "reward/digits/mean" in records[0]
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "prompts_per_step: 2" in config and "loss_agg_mode: token-mean" in config and "my_rewards.digits" in config


def test_eval_and_sample_take_a_device(micro_dir, tmp_path, capsys):
    """--device cpu runs; a CUDA device on a machine without CUDA is the one-line model.device error, exit 2,
    before anything is written."""
    assert main(["eval", "--model", str(micro_dir), "--problems", "2", "--max-new-tokens", "2",
                 "--device", "cpu"]) == 0
    capsys.readouterr()
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the error path needs a machine without it")
    assert main(["eval", "--model", str(micro_dir), "--problems", "2", "--device", "cuda"]) == 2
    assert "model.device" in capsys.readouterr().err
    out = tmp_path / "s.jsonl"
    assert main(["sample", "--model", str(micro_dir), "--problems", "2", "--out", str(out), "--device", "cuda:0"]) == 2
    assert "model.device" in capsys.readouterr().err and not out.exists()
