"""Tiny training runs for the reliability tests (resume, signals, bad input): the micro model, a
reward that varies within groups, in-process and subprocess runs, and bit-for-bit comparisons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from grpo.config import build_config
from grpo.api.trainer import train
from grpo.training.loop import TrainResult

ROOT = Path(__file__).resolve().parent.parent
#: Metrics that measure wall-clock speed: the only values allowed to differ between equal runs.
TIMING_PREFIXES = ("time/", "rollout/tokens_per_s")


def make_micro_dir(directory: Path, size: str = "micro") -> Path:
    """The micro model (or another `grpo.modeling.models.MODEL_SIZES` entry) and its tokenizer saved as a
    Hugging Face directory."""
    from grpo.modeling.models import build_model, build_tokenizer

    tok = build_tokenizer()
    build_model(tok, size, seed=0).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def make_reward(directory: Path) -> str:
    """A `file.py:function` reward that counts digits (varies within groups, so gradients are non-zero)."""
    path = directory / "digits_reward.py"
    path.write_text("def digits(prompts, completions, **kw):\n"
                    "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    return f"{path}:digits"


def tiny_config(model_dir: Path, reward: str, out: Path, **over) -> dict:
    """Flat overrides of a run that takes well under a second per step on one CPU thread."""
    return {"model.path": str(model_dir), "reward.functions": [reward], "train.output_dir": str(out),
            "train.max_steps": 6, "train.save_steps": 2, "train.prompts_per_step": 2, "cpu.num_threads": 1,
            "rollout.num_generations": 4, "rollout.max_new_tokens": 6, "optim.lr": 1e-2,
            "data.num_train_prompts": 20, "log.progress_bar": False, **over}


def run_in_process(flat: dict, **over) -> TrainResult:
    return train(build_config(overrides={**flat, **over}))


def train_command(flat: dict, kill_at: str | None = None, resume: bool = False,
                  omp_threads: int | None = 1) -> tuple[list[str], dict]:
    """argv and environment of `python -m grpo train --config <flat as YAML>` (the YAML is written next
    to the output directory); with `kill_at`, through tests/kill_hook.py (a signal at a named point).

    `omp_threads`: OMP_NUM_THREADS of the child; None leaves torch its default thread count."""
    out = Path(flat["train.output_dir"])
    nested: dict = {}
    for key, value in flat.items():
        section, _, name = key.partition(".")
        nested.setdefault(section, {})[name] = value
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(nested))
    env = {**os.environ, "OMP_NUM_THREADS": str(omp_threads), "TQDM_DISABLE": "1"}
    if omp_threads is None:
        env.pop("OMP_NUM_THREADS")
    entry = ["-m", "tests.kill_hook", kill_at, "--"] if kill_at else ["-m", "grpo"]
    argv = [sys.executable, *entry, "train", "--config", str(config)] + (["--resume"] if resume else [])
    return argv, env


def run_subprocess(flat: dict, kill_at: str | None = None, resume: bool = False,
                   omp_threads: int | None = 1) -> subprocess.CompletedProcess:
    """Run :func:`train_command` to its end (or its kill)."""
    argv, env = train_command(flat, kill_at, resume, omp_threads)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def final_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The trained tensors of a checkpoint (full model or LoRA adapter)."""
    name = "adapter_model.safetensors" if (checkpoint / "adapter_model.safetensors").is_file() else "model.safetensors"
    return load_file(str(checkpoint / name))


def records(out: Path, metrics_file: str = "metrics.jsonl") -> list[dict]:
    """metrics.jsonl without the wall-clock values."""
    rows = [json.loads(line) for line in (out / metrics_file).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def assert_same_run(a: Path, b: Path, step: int) -> None:
    """Bit-identical final weights and equal metrics (timings aside) of two output directories."""
    wa, wb = final_weights(a / f"checkpoint-{step}"), final_weights(b / f"checkpoint-{step}")
    assert wa.keys() == wb.keys() and wa
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "final weights differ"
    ra, rb = records(a), records(b)
    assert [r["step"] for r in rb] == list(range(1, step + 1))
    diff = [(x["step"], k, x.get(k), y.get(k)) for x, y in zip(ra, rb) for k in sorted(x.keys() | y.keys())
            if x.get(k) != y.get(k)]
    assert ra == rb, f"metrics differ (step, key, {a.name}, {b.name}): {diff[:10]}"


def cli_argv(flat: dict, *extra: str) -> list[str]:
    """`grpo train` arguments setting every key of `flat` (values as YAML/JSON)."""
    return ["train", *(f"--{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in flat.items()), *extra]
