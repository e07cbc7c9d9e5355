"""`grpo pipeline recipe.yaml`: stages run in order, each a command of this CLI run in this process through its
Python function (grpo/cli/stages.py), later stages using earlier outputs (``${stage.output}``); resumable stage by
stage.

    output_dir: runs/r1                     # stage outputs go to output_dir/<name>
    stages:
      - {name: cold, kind: sft, args: {model: ./base, dataset: cot.jsonl, max-steps: 200}}
      - {name: rl, kind: grpo, args: {model: "${cold.output}", dataset: math.jsonl, reward: [math_accuracy]}}
      - {name: test, kind: eval, args: {model: "${rl.output}", dataset: test.jsonl, reward: [math_accuracy]}}

Kinds and their outputs: ``sft`` (grpo sft --dataset) and ``grpo`` (grpo train): the last checkpoint;
``sample`` (grpo sample): its JSONL; ``eval`` (grpo eval): its directory with summary.json;
``reward_model`` (grpo reward-model): the reward model directory. ``args`` become flags (``key: v`` ->
``--key v``; a list repeats the flag; ``true`` is a bare flag, except for ``section.key`` config keys,
which get ``true`` / ``false``). ``pipeline.json`` in output_dir records
each stage (running / done, its output, its kind and args): a rerun skips finished stages and resumes an
interrupted sft, grpo or sample stage from its checkpoint; a stage whose kind or args changed is run again
with every stage after it (their old directories kept as <name>.replaced-N). Unknown keys and references
other than ``${stage.output}`` to an earlier stage are errors before any stage runs. At the end, every eval stage's summary is printed as a table,
and, when eval stages measure several models on several domains (``task:`` or ``dataset:``), a table of
pass@1 with one row per model and one column per domain.

Two kinds need no model: ``task_data`` (args task, rows, worked_fraction, seed: SFT demonstrations of an
embedded task) and ``merge`` (args inputs: a list of JSONL files, shuffled with seed; columns: sft keeps
prompt, completion and answer, all keeps every column); their output is the JSONL they write.

``grpo pipeline --preset r1`` runs the built-in DeepSeek-R1 recipe on the embedded arithmetic and strings
domains (grpo/cli/recipes.py): cold-start SFT, GRPO per domain, rejection sampling, SFT of the merged
samples from the base model, every model evaluated on both domains; ``--size small`` shrinks every stage,
``--print-recipe`` prints it as YAML.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import yaml

from grpo.cli.common import run_guarded
from grpo.cli.recipes import LOCAL_KINDS, PRESETS
from grpo.cli.stages import run_stage
from grpo.config import ConfigError, load_yaml
from grpo.config.names import did_you_mean

COMMANDS = {"sft": "sft", "grpo": "train", "sample": "sample", "eval": "eval", "reward_model": "reward-model"}
KINDS = (*COMMANDS, "task_data", "merge")
OUTPUT_FLAG = {"sft": "--output-dir", "grpo": "--output-dir", "sample": "--out", "eval": "--out",
               "reward_model": "--out"}
REFERENCE = re.compile(r"\$\{([A-Za-z0-9_-]+)\.output\}")
ANY_REFERENCE = re.compile(r"\$\{[^}]*\}?")
RECIPE_KEYS = ("output_dir", "stages")
STAGE_KEYS = ("name", "kind", "args")


def add_parser(sub) -> None:
    p = sub.add_parser("pipeline", help="Run a multi-stage recipe (sft, grpo, sample, eval, reward_model stages), "
                                        "resumable stage by stage.", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", nargs="?", help="Recipe YAML (see `grpo pipeline --help`).")
    p.add_argument("--preset", help="A built-in recipe instead of a file: r1 (DeepSeek-R1 on the embedded domains).")
    p.add_argument("--size", default="full", help="Size of the preset's stages: full | small (default full).")
    p.add_argument("--out", help="Output directory (overrides the recipe's output_dir; the preset's default: "
                                 "runs/<preset>).")
    p.add_argument("--print-recipe", dest="print_recipe", action="store_true",
                   help="Print the recipe as YAML and exit.")
    p.set_defaults(func=cmd_pipeline)


def load_recipe(path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """(output_dir, stages) of a recipe file, checked (:func:`check_recipe`)."""
    return check_recipe(load_yaml(path), str(path))


def check_recipe(recipe: dict[str, Any], path: str) -> tuple[Path, list[dict[str, Any]]]:
    """(output_dir, stages) of a recipe, checked: names unique, kinds known, references to earlier stages only."""
    if not isinstance(recipe, dict):
        raise ConfigError(f"{path}: a recipe is a mapping with {' and '.join(RECIPE_KEYS)}")
    for key in recipe:
        if key not in RECIPE_KEYS:
            raise ConfigError(f"{path}: unknown key '{key}'{did_you_mean(str(key), list(RECIPE_KEYS))}; "
                              f"a recipe has {', '.join(RECIPE_KEYS)}")
    stages = recipe.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError(f"{path}: 'stages' must be a non-empty list")
    seen: list[str] = []
    for i, stage in enumerate(stages):
        name = stage.get("name") if isinstance(stage, dict) else None
        where = f"{path}: stage {i + 1}" + (f" '{name}'" if name else "")
        if not name or not isinstance(name, str):
            raise ConfigError(f"{where}: needs a 'name'")
        for key in stage:
            if key not in STAGE_KEYS:
                raise ConfigError(f"{where}: unknown key '{key}'{did_you_mean(str(key), list(STAGE_KEYS))}; "
                                  f"a stage has {', '.join(STAGE_KEYS)}")
        if name in seen:
            raise ConfigError(f"{where}: the name is used twice")
        if stage.get("kind") not in KINDS:
            raise ConfigError(f"{where}: kind must be one of {' | '.join(KINDS)}, got {stage.get('kind')!r}")
        args = stage.get("args") or {}
        if not isinstance(args, dict):
            raise ConfigError(f"{where}: 'args' must be a mapping of flags")
        for ref in ANY_REFERENCE.findall(json.dumps(args)):
            known = REFERENCE.fullmatch(ref)
            if not known:
                raise ConfigError(f"{where}: '{ref}' is not a reference: write ${{STAGE.output}}, STAGE an earlier "
                                  f"stage ({', '.join(seen) or 'none before this one'})")
            if known.group(1) not in seen:
                raise ConfigError(f"{where}: refers to '{known.group(1)}', which is not an earlier stage"
                                  f"{did_you_mean(known.group(1), seen)}")
        seen.append(name)
    return Path(recipe.get("output_dir") or "runs/pipeline"), stages


def flags(args: dict[str, Any], outputs: dict[str, str]) -> list[str]:
    """``{key: value}`` -> ``--key value`` (lists repeat the flag, true is a bare flag), references filled in."""
    argv: list[str] = []
    for key, value in args.items():
        for v in (value if isinstance(value, list) else [value]):
            if isinstance(v, bool) and "." in key:           # a config key (section.key) takes true / false
                argv += [f"--{key}", str(v).lower()]
            elif v is True:
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


def fill(value: Any, outputs: dict[str, str]) -> Any:
    """`value` with every ``${name.output}`` replaced (inside lists and mappings too)."""
    if isinstance(value, str):
        return REFERENCE.sub(lambda m: outputs[m.group(1)], value)
    if isinstance(value, list):
        return [fill(v, outputs) for v in value]
    return {k: fill(v, outputs) for k, v in value.items()} if isinstance(value, dict) else value


def the_recipe(args: argparse.Namespace) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """(output_dir, stages, recipe) from the recipe file or --preset, --out applied."""
    if bool(args.recipe) == bool(args.preset):
        raise ConfigError("grpo pipeline: give a recipe file or --preset NAME (one of them)")
    if args.preset:
        if args.preset not in PRESETS:
            raise ConfigError(f"unknown pipeline preset '{args.preset}'; choose from {', '.join(PRESETS)}")
        recipe = PRESETS[args.preset](args.out or f"runs/{args.preset}", args.size)
    else:
        recipe = load_yaml(args.recipe)
        recipe = {**recipe, "output_dir": args.out} if args.out else recipe
    out, stages = check_recipe(recipe, args.recipe or f"preset {args.preset}")
    return out, stages, recipe


def cmd_pipeline(args: argparse.Namespace, extra: list[str]) -> int:
    out, stages, recipe = the_recipe(args)
    if args.print_recipe:
        print(yaml.safe_dump(recipe, sort_keys=False), end="")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    status_file = out / "pipeline.json"
    status = json.loads(status_file.read_text()) if status_file.is_file() else {"stages": {}}
    rerun_changed(out, stages, status)
    status_file.write_text(json.dumps(status, indent=1))
    outputs = {n: s["output"] for n, s in status["stages"].items() if s.get("status") == "done"}
    for stage in stages:
        name, kind = stage["name"], stage["kind"]
        where = out / name
        if status["stages"].get(name, {}).get("status") == "done":
            print(f"pipeline: stage {name} ({kind}) done, skipped", flush=True)
            continue
        if kind in LOCAL_KINDS:                                 # task_data / merge: no model, no subcommand
            run_local, file_name = LOCAL_KINDS[kind]
            print(f"pipeline: stage {name} ({kind})", flush=True)
            run_local(fill(stage.get("args") or {}, outputs), where / file_name)
            outputs[name] = str(where / file_name)
            status["stages"][name] = {"kind": kind, "status": "done", "output": outputs[name], "spec": spec(stage)}
            status_file.write_text(json.dumps(status, indent=1))
            continue
        resuming = status["stages"].get(name, {}).get("status") == "running" and kind in ("sft", "grpo", "sample")
        target = str(where / "samples.jsonl") if kind == "sample" else str(where)
        argv = [COMMANDS[kind], *flags(stage.get("args") or {}, outputs), OUTPUT_FLAG[kind], target]
        argv += ["--resume"] if resuming else []
        status["stages"][name] = {"kind": kind, "status": "running", "argv": argv, "spec": spec(stage)}
        status_file.write_text(json.dumps(status, indent=1))
        print(f"pipeline: stage {name} ({kind}){' resumed' if resuming else ''}: grpo {' '.join(argv)}", flush=True)
        code = run_guarded(lambda: run_stage(kind, fill(stage.get("args") or {}, outputs), target, resuming, argv),
                           debug=getattr(args, "debug", False))
        if code != 0:
            print(f"pipeline: stage {name} failed (exit {code}); rerun the pipeline to resume it", flush=True)
            return code
        outputs[name] = stage_output(kind, where)
        status["stages"][name].update(status="done", output=outputs[name])
        status_file.write_text(json.dumps(status, indent=1))
    print(eval_table(out, stages))
    table = domain_table(out, stages)
    if table:
        print(table)
        (out / "domains.md").write_text(table + "\n")
    return 0


def spec(stage: dict[str, Any]) -> dict[str, Any]:
    """What decides a stage's result (its kind and args as written, references unfilled), as pipeline.json
    records it."""
    return json.loads(json.dumps({"kind": stage["kind"], "args": stage.get("args") or {}}, sort_keys=True))


def rerun_changed(out: Path, stages: list[dict[str, Any]], status: dict[str, Any]) -> None:
    """A stage whose kind or args changed since pipeline.json recorded it is run again, and so is every stage
    after it (they may use its output): their records are dropped and their directories kept aside as
    <name>.replaced-N (nothing is deleted)."""
    recorded = status["stages"]
    changed = next((i for i, st in enumerate(stages) if st["name"] in recorded
                    and recorded[st["name"]].get("spec", spec(st)) != spec(st)), None)
    if changed is None:
        return
    later = [st["name"] for st in stages[changed:] if st["name"] in recorded]
    print(f"pipeline: stage {stages[changed]['name']} changed in the recipe since its last run: running it again"
          + (f", and {', '.join(later[1:])} after it" if len(later) > 1 else ""), flush=True)
    for name in later:
        del recorded[name]
        where = out / name
        if where.exists():
            n = 1
            while where.with_name(f"{name}.replaced-{n}").exists():
                n += 1
            where.rename(where.with_name(f"{name}.replaced-{n}"))
            print(f"pipeline: the earlier results of {name} are kept in {where.with_name(f'{name}.replaced-{n}')}",
                  flush=True)


def eval_table(out: Path, stages: list[dict[str, Any]]) -> str:
    """Every eval stage's summary.json as one table (stages in order)."""
    rows = [(s["name"], json.loads((out / s["name"] / "summary.json").read_text())) for s in stages
            if s["kind"] == "eval" and (out / s["name"] / "summary.json").is_file()]
    if not rows:
        return "pipeline: done (no eval stage)"
    keys = list(dict.fromkeys(k for _, summary in rows for k in summary if k not in ("problems", "samples_per_problem")))
    lines = ["| stage | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name, summary in rows:
        lines.append(f"| {name} | " + " | ".join(f"{summary.get(k):.4f}" if isinstance(summary.get(k), float)
                                                  else "-" if summary.get(k) is None else str(summary.get(k))
                                                  for k in keys) + " |")
    return "\n".join(lines)


def eval_target(stage: dict[str, Any]) -> tuple[str, str]:
    """(model, domain) an eval stage measures: the stage its --model refers to (else the path, or "base"),
    and its --task (without --dataset) or its dataset's file name."""
    args = stage.get("args") or {}
    model = str(args.get("model") or "base")
    ref = REFERENCE.fullmatch(model)
    domain = Path(str(args["dataset"])).name if args.get("dataset") else str(args.get("task") or "arithmetic")
    return (ref.group(1) if ref else model), domain


def domain_table(out: Path, stages: list[dict[str, Any]]) -> str | None:
    """pass@1 of every evaluated model (rows, in order) on every domain (columns); None unless eval stages
    cover more than one domain."""
    cells: dict[str, dict[str, float]] = {}
    domains: list[str] = []
    for s in stages:
        summary_file = out / s["name"] / "summary.json"
        if s["kind"] != "eval" or not summary_file.is_file():
            continue
        model, domain = eval_target(s)
        summary = json.loads(summary_file.read_text())
        cells.setdefault(model, {})[domain] = summary.get("pass@1")
        domains += [domain] if domain not in domains else []
    if len(domains) < 2:
        return None
    lines = ["| model (pass@1, held-out) | " + " | ".join(domains) + " |", "|---" * (len(domains) + 1) + "|"]
    for model, row in cells.items():
        lines.append(f"| {model} | " + " | ".join("-" if row.get(d) is None else f"{row[d]:.3f}" for d in domains)
                     + " |")
    return "\n".join(lines)
