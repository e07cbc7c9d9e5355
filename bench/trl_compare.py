"""Our trainer against TRL's GRPOTrainer on identical settings: seconds per step and peak memory.

    bash bench/setup_trl.sh                         # once: TRL in bench/.trl-venv (CPU torch)
    .venv/bin/python bench/trl_compare.py [--configs embedded,qwen2-100m] [--steps 6] [--rounds 2]

Both sides train from the same model directory on the same prompts (the embedded arithmetic task
written to a JSONL file), with the same reward functions (accuracy + format from grpo.rewards), G,
prompts per step, completion length, temperature 1, beta = 0.04, AdamW (same lr, betas (0.9, 0.99),
no weight decay, constant schedule, gradient clipping at 1.0), loss aggregation over tokens of each
sequence then over sequences (ours `seq-mean-token-mean`, TRL `loss_type="grpo"`), group-scaled
advantages, one optimizer step per generation batch and no micro-batching. Each run is a fresh
process (peak RSS = ru_maxrss of that process, model loading included on both sides); ours and TRL
alternate, `--rounds` times each. Seconds per step: median over steps 2.. of each run (step 1 is
the warm-up), then the median over rounds. Writes bench/results/trl_compare.json and prints a
Markdown table for docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRL_PYTHON = ROOT / "bench" / ".trl-venv" / "bin" / "python"
CONFIGS = {
    "embedded": dict(prompts=16, G=8, new_tokens=40, threads=1, lr=3e-5),
    "qwen2-100m": dict(prompts=2, G=8, new_tokens=64, threads=2, lr=1e-6),
}
BETA = 0.04

OURS_TRAIN = r"""
import json, resource, sys, time
import torch
from grpo.config import build_config
from grpo.api.trainer import train
spec = json.loads(sys.argv[1])
cfg = build_config(overrides={
    "model.path": spec["model"], "data.dataset": spec["data"], "data.shuffle": False,
    "reward.functions": ["accuracy", "format"], "rollout.num_generations": spec["G"],
    "rollout.max_new_tokens": spec["new_tokens"], "rollout.temperature": 1.0,
    "algorithm.beta": spec["beta"], "algorithm.loss_agg_mode": "seq-mean-token-mean",
    "algorithm.advantage.scale_rewards": "group", "optim.lr": spec["lr"], "optim.adam_beta1": 0.9, "optim.adam_beta2": 0.99,
    "optim.weight_decay": 0.0, "optim.max_grad_norm": 1.0, "optim.lr_scheduler": "constant",
    "train.prompts_per_step": spec["prompts"], "train.micro_batch_size": 0, "train.max_steps": spec["steps"],
    "cpu.num_threads": spec["threads"], "train.output_dir": spec["out"], "train.save_final": False,
    "log.progress_bar": False, **spec.get("overrides", {})})
result = train(cfg)
"""
OURS = OURS_TRAIN + r"""
steps = [json.loads(line)["time/step_s"] for line in open(spec["out"] + "/metrics.jsonl")]
print(json.dumps({"step_s": steps, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

TRL = r"""
import json, resource, sys, time
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["root"])
import torch
torch.set_num_threads(spec["threads"])
from datasets import load_dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from grpo.rewards import load_reward

class Clock(TrainerCallback):
    def __init__(self):
        self.times = []
    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)

tok = PreTrainedTokenizerFast.from_pretrained(spec["model"])
tok.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
rewards = [load_reward("accuracy")[1], load_reward("format")[1]]
args = GRPOConfig(
    output_dir=spec["out"], per_device_train_batch_size=spec["prompts"] * spec["G"], gradient_accumulation_steps=1,
    steps_per_generation=1, num_generations=spec["G"], max_completion_length=spec["new_tokens"],
    temperature=1.0, top_k=0, top_p=1.0, beta=spec["beta"], loss_type="grpo", scale_rewards="group",
    learning_rate=spec["lr"], adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
    lr_scheduler_type="constant", warmup_steps=0, max_steps=spec["steps"], num_iterations=1,
    use_cpu=True, bf16=spec.get("precision", "fp32") == "bf16", fp16=False, report_to="none", save_strategy="no", logging_steps=1,
    shuffle_dataset=False, dataloader_num_workers=0, seed=0, disable_tqdm=True, log_completions=False)
data = load_dataset("json", data_files=spec["data"], split="train")
clock = Clock()
trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=data, processing_class=tok,
                      callbacks=[clock])
trainer.train()
print(json.dumps({"step_s": clock.times, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "mixed_precision": str(trainer.accelerator.mixed_precision)}))
"""


def run(side: str, spec: dict) -> dict:
    """One training run in a fresh process; returns {"step_s": [...], "peak_rss_mb": float}."""
    python = str(TRL_PYTHON) if side == "trl" else sys.executable
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([python, "-c", TRL if side == "trl" else OURS, json.dumps(spec)], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench/trl_compare.py: the {side} run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_prompts(path: Path, n: int) -> None:
    from bench.common import arithmetic_rows

    path.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(n)))


def compare(name: str, steps: int, rounds: int, tmp: Path) -> dict:
    from bench.common import median
    from bench.speed import model_dir

    c = CONFIGS[name]
    data = tmp / "prompts.jsonl"
    write_prompts(data, 4096)
    results = {"ours": [], "trl": []}
    for r in range(rounds):
        for side in ("ours", "trl") if r % 2 == 0 else ("trl", "ours"):
            spec = {**c, "model": str(model_dir(name)), "data": str(data), "beta": BETA, "steps": steps,
                    "out": str(tmp / f"{name}-{side}-{r}"), "root": str(ROOT)}
            out = run(side, spec)
            print(f"  {name} {side} round {r}: step_s {[round(s, 3) for s in out['step_s']]}, "
                  f"peak {out['peak_rss_mb']:.0f} MiB", flush=True)
            results[side].append(out)
    row = {"config": name, "threads": c["threads"], "G": c["G"], "prompts": c["prompts"], "new_tokens": c["new_tokens"]}
    for side, runs in results.items():
        row[f"{side}_step_s"] = median([median(o["step_s"][1:]) for o in runs])
        row[f"{side}_peak_mb"] = median([o["peak_rss_mb"] for o in runs])
    row["step_ratio"] = row["ours_step_s"] / row["trl_step_s"]
    row["memory_ratio"] = row["ours_peak_mb"] / row["trl_peak_mb"]
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| config | threads | ours s/step | TRL s/step | ratio | ours peak MiB | TRL peak MiB | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['config']} (G={r['G']}, {r['prompts']} prompts, {r['new_tokens']} tokens) | {r['threads']} "
                     f"| {r['ours_step_s']:.2f} | {r['trl_step_s']:.2f} | {r['step_ratio']:.2f} "
                     f"| {r['ours_peak_mb']:.0f} | {r['trl_peak_mb']:.0f} | {r['memory_ratio']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    from bench.common import print_table, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="embedded,qwen2-100m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not TRL_PYTHON.is_file():
        raise SystemExit(f"{TRL_PYTHON} not found: run `bash bench/setup_trl.sh` first")
    trl_version = subprocess.run([str(TRL_PYTHON), "-c", "import trl; print(trl.__version__)"], capture_output=True,
                                 text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [compare(name, args.steps, args.rounds, Path(tmp)) for name in args.configs.split(",")]
    print_table(rows, ["config", "threads", "ours_step_s", "trl_step_s", "step_ratio", "ours_peak_mb", "trl_peak_mb",
                       "memory_ratio"])
    print(markdown(rows))
    path = write_results("trl_compare", rows, {"trl": trl_version, "steps": args.steps, "rounds": args.rounds,
                                               "beta": BETA, "markdown": markdown(rows)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
