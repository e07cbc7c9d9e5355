"""Built-in pipeline recipes (`grpo pipeline --preset NAME`) and the stage kinds that need no model:
``task_data`` (SFT rows of an embedded task) and ``merge`` (several JSONL files into one, shuffled).

The ``r1`` preset is DeepSeek-R1's recipe on the two embedded domains (arithmetic, strings), with
DeepSeek-V4's per-domain isolation:

1. cold start: SFT of the embedded base on worked and direct demonstrations of both domains;
2. reasoning GRPO per domain, each from the cold start, on its own domain with its own rewards;
3. rejection sampling from each domain's RL checkpoint (correct samples only, deduplicated);
4. the merge: SFT of the cold-start model on both domains' samples (R1 starts this second SFT from
   the base model; at this scale that loses the cold start's strings skill, so it starts from cold);
5. all-scenario GRPO on the mixed prompts of both domains, with rewards that hold for both
   (``exact_match``, ``format``);

with every model evaluated on both domains' held-out splits (greedy pass@1). `grpo pipeline --preset r1
--print-recipe` prints the recipe as YAML, to copy and change.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.config import ConfigError
from grpo.data.tasks import TASKS

DOMAINS = ("arithmetic", "strings")


@dataclass(frozen=True)
class R1Size:
    """The sizes of the r1 preset's stages (`--size`)."""

    cold_rows: int = 2000               # demonstrations per domain in the cold-start data
    cold_steps: int = 300               # cold-start SFT steps (64 rows each)
    grpo_steps: int = 100               # GRPO steps per domain (16 prompts x G = 8)
    sample_problems: int = 768          # train problems per domain for rejection sampling (4 samples each)
    distill_steps: int = 200            # SFT steps on the merged samples, from the cold start
    final_steps: int = 100              # all-domain GRPO steps on mixed prompts
    eval_problems: int = 256            # held-out problems per domain and eval


SIZES = {"full": R1Size(), "small": R1Size(cold_rows=600, cold_steps=60, grpo_steps=12, sample_problems=96,
                                           distill_steps=40, final_steps=10, eval_problems=64)}


def r1_recipe(output_dir: str, size: str = "full") -> dict[str, Any]:
    """The r1 preset as a recipe (the mapping a recipe YAML holds)."""
    if size not in SIZES:
        raise ValueError(f"--size must be one of {' | '.join(SIZES)}, got {size!r}")
    z = SIZES[size]
    quiet = {"log.progress_bar": False, "cpu.num_threads": 1}
    sft = {"optim.lr": 2e-3, "optim.warmup_steps": 10, "train.micro_batch_size": 64, **quiet}
    grpo = {"rollout.num_generations": 8, "rollout.max_new_tokens": 40, "train.prompts_per_step": 16,
            "optim.lr": 3e-5, "optim.warmup_steps": 5, "algorithm.beta": 0.04, **quiet}

    def evals(model: str) -> list[dict[str, Any]]:
        """`model` on both domains' held-out splits, right after it is trained."""
        return [{"name": f"eval_{model}_{d}", "kind": "eval", "args": {
            "model": f"${{{model}.output}}", "task": d, "problems": z.eval_problems, "max-new-tokens": 40}}
            for d in DOMAINS]

    stages: list[dict[str, Any]] = [
        {"name": f"data_{d}", "kind": "task_data",
         "args": {"task": d, "rows": z.cold_rows, "worked_fraction": 0.45 if d == "arithmetic" else 0.3}}
        for d in DOMAINS]
    stages += [
        {"name": "cold_data", "kind": "merge", "args": {"inputs": [f"${{data_{d}.output}}" for d in DOMAINS]}},
        {"name": "cold", "kind": "sft", "args": {"dataset": "${cold_data.output}", "max-steps": z.cold_steps, **sft}},
        *evals("cold"),
    ]
    for d in DOMAINS:
        stages += [{"name": f"rl_{d}", "kind": "grpo", "args": {
            "model": "${cold.output}", "data.task": d, "max-steps": z.grpo_steps, **grpo}}, *evals(f"rl_{d}")]
    for d in DOMAINS:
        stages.append({"name": f"samples_{d}", "kind": "sample", "args": {
            "model": f"${{rl_{d}.output}}", "task": d, "problems": z.sample_problems, "num-samples": 4,
            "keep": "correct", "dedupe": True, "max-per-prompt": 2, "max-new-tokens": 40}})
    stages += [
        {"name": "distill_data", "kind": "merge", "args": {"inputs": [f"${{samples_{d}.output}}" for d in DOMAINS]}},
        {"name": "distill", "kind": "sft", "args": {"model": "${cold.output}", "dataset": "${distill_data.output}",
                                                    "max-steps": z.distill_steps, **sft, "optim.lr": 1e-3}},
        *evals("distill"),
        {"name": "mixed_prompts", "kind": "merge", "args": {"inputs": [f"${{data_{d}.output}}" for d in DOMAINS],
                                                            "columns": "prompts", "seed": 1}},
        {"name": "rl_all", "kind": "grpo", "args": {
            "model": "${distill.output}", "dataset": "${mixed_prompts.output}", "reward": ["exact_match", "format"],
            "max-steps": z.final_steps, **grpo}},
        *evals("rl_all"),
    ]
    return {"output_dir": output_dir, "stages": stages}


PRESETS = {"r1": r1_recipe}


def write_task_data(args: dict[str, Any], out: Path) -> None:
    """`task_data` stage: `rows` SFT demonstrations of embedded task `task` (`worked_fraction` of them
    worked, the rest direct; `seed`) as JSONL rows prompt / completion / answer."""
    unknown = set(args) - {"task", "rows", "worked_fraction", "seed"}
    if unknown or args.get("task") not in TASKS:
        raise ConfigError(f"task_data args: task ({' | '.join(TASKS)}), rows, worked_fraction, seed; got "
                          f"{sorted(unknown) or args.get('task')!r}")
    rows = TASKS[args["task"]].sft_examples(int(args.get("rows", 1000)), seed=int(args.get("seed", 0)),
                                            worked_fraction=float(args.get("worked_fraction", 0.5)))
    write_jsonl(out, rows)


MERGE_COLUMNS = {"sft": ("prompt", "completion", "answer"), "prompts": ("prompt", "answer")}


def merge_files(args: dict[str, Any], out: Path) -> None:
    """`merge` stage: the rows of every file of `inputs`, shuffled with `seed` (default 0; `shuffle: false`
    keeps the order), keeping the columns of `columns`: sft (prompt, completion, answer; the default),
    prompts (prompt, answer: a GRPO prompt set) or all."""
    inputs = args.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ConfigError("merge args: 'inputs' must be a non-empty list of JSONL files")
    rows = []
    for name in inputs:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"merge: input file not found: {path}")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{n}: invalid JSON ({e.msg})") from None
    keep = MERGE_COLUMNS.get(args.get("columns", "sft"), ())
    if args.get("columns", "sft") not in (*MERGE_COLUMNS, "all"):
        raise ConfigError(f"merge args: columns must be sft | prompts | all, got {args.get('columns')!r}")
    if keep:
        rows = [{k: r[k] for k in keep if k in r} for r in rows]
    if args.get("shuffle", True):
        random.Random(int(args.get("seed", 0))).shuffle(rows)
    write_jsonl(out, rows)


def write_jsonl(out: Path, rows: list[dict[str, Any]]) -> None:
    """Write atomically (a temporary file renamed), so a stopped stage leaves no half file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out)


#: Stage kinds run inside the pipeline (no model): kind -> (function(args, output file), output file name).
LOCAL_KINDS = {"task_data": (write_task_data, "rows.jsonl"), "merge": (merge_files, "merged.jsonl")}
