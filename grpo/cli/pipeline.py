"""`grpo pipeline recipe.yaml`: stages run in order, each an entry point of this CLI, later stages using
earlier outputs (``${stage.output}``); resumable stage by stage.

    output_dir: runs/r1                     # stage outputs go to output_dir/<name>
    stages:
      - {name: cold, kind: sft, args: {model: ./base, dataset: cot.jsonl, max-steps: 200}}
      - {name: rl, kind: grpo, args: {model: "${cold.output}", dataset: math.jsonl, reward: [math_accuracy]}}
      - {name: test, kind: eval, args: {model: "${rl.output}", dataset: test.jsonl, reward: [math_accuracy]}}

Kinds and their outputs: ``sft`` (grpo sft --dataset) and ``grpo`` (grpo train): the last checkpoint;
``sample`` (grpo sample): its JSONL; ``eval`` (grpo eval): its directory with summary.json;
``reward_model`` (grpo reward-model): the reward model directory. ``args`` become flags (``key: v`` ->
``--key v``; a list repeats the flag; ``true`` is a bare flag). ``pipeline.json`` in output_dir records
each stage (running / done, its output): a rerun skips finished stages and resumes an interrupted sft,
grpo or sample stage from its checkpoint. At the end, every eval stage's summary is printed as a table.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import yaml

COMMANDS = {"sft": "sft", "grpo": "train", "sample": "sample", "eval": "eval", "reward_model": "reward-model"}
OUTPUT_FLAG = {"sft": "--output-dir", "grpo": "--output-dir", "sample": "--out", "eval": "--out",
               "reward_model": "--out"}
REFERENCE = re.compile(r"\$\{([A-Za-z0-9_-]+)\.output\}")


def add_parser(sub) -> None:
    p = sub.add_parser("pipeline", help="Run a multi-stage recipe (sft, grpo, sample, eval, reward_model stages), "
                                        "resumable stage by stage.", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", help="Recipe YAML (see `grpo pipeline --help`).")
    p.set_defaults(func=cmd_pipeline)


def load_recipe(path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """(output_dir, stages) of a recipe, checked: names unique, kinds known, references to earlier stages only."""
    from grpo.config import ConfigError, load_yaml

    recipe = load_yaml(path)
    stages = recipe.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError(f"{path}: 'stages' must be a non-empty list")
    seen: list[str] = []
    for i, stage in enumerate(stages):
        name = stage.get("name") if isinstance(stage, dict) else None
        where = f"{path}: stage {i + 1}" + (f" '{name}'" if name else "")
        if not name or not isinstance(name, str):
            raise ConfigError(f"{where}: needs a 'name'")
        if name in seen:
            raise ConfigError(f"{where}: the name is used twice")
        if stage.get("kind") not in COMMANDS:
            raise ConfigError(f"{where}: kind must be one of {' | '.join(COMMANDS)}, got {stage.get('kind')!r}")
        args = stage.get("args") or {}
        if not isinstance(args, dict):
            raise ConfigError(f"{where}: 'args' must be a mapping of flags")
        for ref in REFERENCE.findall(yaml.safe_dump(args)):
            if ref not in seen:
                raise ConfigError(f"{where}: refers to '{ref}', which is not an earlier stage")
        seen.append(name)
    return Path(recipe.get("output_dir") or "runs/pipeline"), stages


def flags(args: dict[str, Any], outputs: dict[str, str]) -> list[str]:
    """``{key: value}`` -> ``--key value`` (lists repeat the flag, true is a bare flag), references filled in."""
    argv: list[str] = []
    for key, value in args.items():
        for v in (value if isinstance(value, list) else [value]):
            if v is True:
                argv.append(f"--{key}")
            elif v is not False and v is not None:
                argv += [f"--{key}", REFERENCE.sub(lambda m: outputs[m.group(1)], str(v))]
    return argv


def stage_output(kind: str, where: Path) -> str:
    """What later stages get as ``${name.output}``."""
    if kind in ("sft", "grpo"):
        from grpo.state.checkpoint import list_checkpoints

        done = list_checkpoints(where)
        return str(done[-1]) if done else str(where)
    return str(where / "samples.jsonl") if kind == "sample" else str(where)


def cmd_pipeline(args: argparse.Namespace, extra: list[str]) -> int:
    from grpo.cli.main import main

    out, stages = load_recipe(Path(args.recipe))
    out.mkdir(parents=True, exist_ok=True)
    status_file = out / "pipeline.json"
    status = json.loads(status_file.read_text()) if status_file.is_file() else {"stages": {}}
    outputs = {n: s["output"] for n, s in status["stages"].items() if s.get("status") == "done"}
    for stage in stages:
        name, kind = stage["name"], stage["kind"]
        where = out / name
        if status["stages"].get(name, {}).get("status") == "done":
            print(f"pipeline: stage {name} ({kind}) done, skipped", flush=True)
            continue
        resuming = status["stages"].get(name, {}).get("status") == "running" and kind in ("sft", "grpo", "sample")
        target = str(where / "samples.jsonl") if kind == "sample" else str(where)
        argv = [COMMANDS[kind], *flags(stage.get("args") or {}, outputs), OUTPUT_FLAG[kind], target]
        argv += ["--resume"] if resuming else []
        status["stages"][name] = {"kind": kind, "status": "running", "argv": argv}
        status_file.write_text(json.dumps(status, indent=1))
        print(f"pipeline: stage {name} ({kind}){' resumed' if resuming else ''}: grpo {' '.join(argv)}", flush=True)
        code = main(argv)
        if code != 0:
            print(f"pipeline: stage {name} failed (exit {code}); rerun the pipeline to resume it", flush=True)
            return code
        outputs[name] = stage_output(kind, where)
        status["stages"][name].update(status="done", output=outputs[name])
        status_file.write_text(json.dumps(status, indent=1))
    print(eval_table(out, stages))
    return 0


def eval_table(out: Path, stages: list[dict[str, Any]]) -> str:
    """Every eval stage's summary.json as one table (stages in order)."""
    rows = [(s["name"], json.loads((out / s["name"] / "summary.json").read_text())) for s in stages
            if s["kind"] == "eval" and (out / s["name"] / "summary.json").is_file()]
    if not rows:
        return "pipeline: done (no eval stage)"
    keys = [k for k in rows[0][1] if k not in ("problems", "samples_per_problem")]
    lines = ["| stage | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name, summary in rows:
        lines.append(f"| {name} | " + " | ".join(f"{summary.get(k):.4f}" if isinstance(summary.get(k), float)
                                                  else str(summary.get(k)) for k in keys) + " |")
    return "\n".join(lines)
