"""Speed of one GRPO step, stage by stage: rollout (vs `model.generate`), reference pass, update.

    .venv/bin/python bench/speed.py [--configs embedded,qwen2-100m] [--steps 5]

Two configurations, each in a fresh process (so peak memory is its own):
* embedded: the shipped arithmetic policy (grpo.modeling.models.EMBEDDED_MODEL_DIR) with the demo settings:
  G = 8, 16 prompts per step, 40 new tokens, 1 thread (the demo's `cpu.num_threads`).
* qwen2-100m: a randomly initialised ~100M Qwen2 with a 32k vocabulary (bench/common.py),
  G = 8, 2 prompts per step, 64-token completions, 2 threads.

Every timing is the median of `--steps` runs after one warm-up; the two rollout samplers alternate.
Our side runs as `grpo train` does: linears through oneDNN where faster (cpu.cpu_matmul = auto), the reference pass and
update in token-budget micro-batches (train.micro_batch_tokens = 0); `generate` runs with stock PyTorch
linears. FLOP/s are model FLOPs (forward 2 * params * tokens on the real tokens of each trimmed micro-batch, LM head
only on completion tokens, attention included; backward = 2 x forward; recomputation not counted)
as a fraction of a float32 [2048, 2048] matmul (the faster of MKL and oneDNN) measured in the same process at the same thread count,
right before each step (the machine is shared; each step's FLOP/s is divided by its own peak).
Also measures, in separate processes, the peak memory of one forward + backward of the 100M model
through the chunked LM head vs the full-logits path. Writes bench/results/speed.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import (PeakRSS, arithmetic_rows, build_bench_model, matmul_peak_flops, median,  # noqa: E402
                          print_table, write_results)

CONFIGS = {
    "embedded": dict(prompts=16, G=8, new_tokens=40, threads=1),
    "qwen2-100m": dict(prompts=2, G=8, new_tokens=64, threads=2),
}
MODELS_DIR = Path(tempfile.gettempdir()) / "grpo-bench-models"


def model_dir(name: str) -> Path:
    from grpo.modeling.models import EMBEDDED_MODEL_DIR

    return EMBEDDED_MODEL_DIR if name == "embedded" else build_bench_model(name, MODELS_DIR)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def forward_flops(model, mask: torch.Tensor, T: int, backward: bool) -> float:
    """Model FLOPs of one pass over the real tokens of `mask` (trimmed per batch as the code does).

    Shape: mask [N, P + T]
    """
    from grpo.modeling.logprobs import trim_padding

    cfg = model.config
    _, m, kept = trim_padding(mask, mask, T)
    n, L = m.shape
    emb = cfg.vocab_size * cfg.hidden_size
    body = sum(p.numel() for p in model.parameters()) - emb * (1 if cfg.tie_word_embeddings else 2)
    attention = 4 * cfg.num_hidden_layers * cfg.hidden_size * L / 2      # QK^T and AV, causal half
    flops = n * L * (2 * body + attention) + 2 * emb * int(m[:, -kept:].sum())
    return flops * (3 if backward else 1)


def rollout_pair(model, tok, batch, G: int, new_tokens: int, seed: int, fixed_length: bool,
                 rollout_precision: str = "fp32", generate_precision: str = "fp32"):
    """(ours, generate): (seconds, produced completion tokens) for the same prompts and settings.

    `fixed_length` removes EOS from ours and sets min_new_tokens for generate, so both produce
    exactly G * B * new_tokens tokens. `rollout_precision` / `generate_precision` (fp32 | bf16 | fp16): the
    autocast each side runs under (`rollout.precision` for ours).
    """
    from grpo.cpu.placement import use_cpu_matmul
    from grpo.modeling.precision import autocast
    from grpo.rollout import sample
    from grpo.training.cpu_runtime import install_hooks
    from grpo.rollout.params import Prompts, SamplingParams

    eos = -1 if fixed_length else tok.eos_token_id
    install_hooks()                                           # the CPU runtime's rollout hook
    use_cpu_matmul(model, "auto")                             # ours: the trainer's default
    params = SamplingParams(n=G, max_tokens=new_tokens, temperature=1.0, stop_token_ids=(eos,), seed=seed)
    with autocast(torch.device("cpu"), rollout_precision):
        out, s_ours = timed(lambda: sample(model, Prompts(batch.prompt_ids, batch.prompt_mask), params,
                                           pad_token_id=tok.pad_token_id))
    ours_tokens = int(out.completion_mask.sum())
    use_cpu_matmul(model, "aten")                             # generate: stock PyTorch linears
    with torch.no_grad(), autocast(torch.device("cpu"), generate_precision):
        hf, s_hf = timed(lambda: model.generate(
            input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask, do_sample=True, temperature=1.0,
            top_k=0, top_p=1.0, num_return_sequences=G, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens if fixed_length else 0, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id))
    from grpo.rollout import completion_mask_from_ids

    hf_tokens = int(completion_mask_from_ids(hf[:, batch.prompt_ids.shape[1]:], tok.eos_token_id).sum())
    use_cpu_matmul(model, "auto")
    return (s_ours, ours_tokens), (s_hf, hf_tokens)


def run_config(name: str, steps: int) -> dict:
    """All measurements of one configuration (run in its own process)."""
    from grpo.config import AlgorithmConfig, OptimConfig
    from grpo.data.prompts import tokenize_prompts
    from grpo.modeling.logprobs import completion_logprobs, fixed_logprobs
    from grpo.modeling.models import load_policy
    from grpo.types import TrainBatch
    from grpo.cpu.placement import use_cpu_matmul
    from grpo.training.cpu_runtime import auto_micro_batch_tokens, install_hooks
    from grpo.training.update import (UpdateSettings, bucketed_micro_batches,
                                      build_optimizer, policy_update)

    c = CONFIGS[name]
    torch.set_num_threads(c["threads"])
    rss = PeakRSS()
    model, tok = load_policy(str(model_dir(name)))
    model.generation_config.top_k = None
    install_hooks()                                           # the CPU runtime's model-code hooks
    use_cpu_matmul(model, "auto")                             # as grpo train does (cpu.cpu_matmul)
    ref = copy.deepcopy(model).requires_grad_(False)
    budget = auto_micro_batch_tokens(model)                   # train.micro_batch_tokens = 0
    rows = arithmetic_rows(c["prompts"] * (steps + 1), tok)
    gen = torch.Generator().manual_seed(0)
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-6), 100)
    algo = AlgorithmConfig(beta=0.04)
    rec = {k: [] for k in ("ours", "hf", "ours_fixed", "hf_fixed", "ref", "update", "fwd_bwd", "step_peak", "peak",
                           "ref_mfu", "fwd_bwd_mfu")}
    for i in range(steps + 1):
        batch = tokenize_prompts(tok, rows[i * c["prompts"]:(i + 1) * c["prompts"]])
        peak = matmul_peak_flops(c["threads"], repeats=3)     # every step: the machine is shared
        rss.reset()
        base = rss.current()
        for fixed in (False, True):
            pair = rollout_pair(model, tok, batch, c["G"], c["new_tokens"], i, fixed)
            rec["ours_fixed" if fixed else "ours"].append(pair[0])
            rec["hf_fixed" if fixed else "hf"].append(pair[1])
        from grpo.rollout import sample
        from grpo.rollout.params import Prompts, SamplingParams

        g = sample(model, Prompts(batch.prompt_ids, batch.prompt_mask),
                   SamplingParams(n=c["G"], max_tokens=c["new_tokens"], stop_token_ids=(tok.eos_token_id,), seed=i),
                   pad_token_id=tok.pad_token_id)
        ids = torch.cat([g.prompt_ids, g.completion_ids], 1)
        mask = torch.cat([g.prompt_mask, g.completion_mask], 1)
        T = g.completion_ids.shape[1]
        ref_lp, s_ref = timed(lambda: fixed_logprobs(ref, ids, mask, T, 1.0, max_tokens=budget))
        adv = torch.randn(ids.shape[0], generator=gen)
        train = TrainBatch(ids, mask, g.completion_mask.float(), adv, None, ref_lp)
        _, s_update = timed(lambda: policy_update(model, opt, sched, train, algo,
                                                  UpdateSettings(temperature=1.0, micro_batch_size=0, max_grad_norm=1.0,
                                                                 micro_batch_tokens=budget)))

        def fwd_bwd():                                        # the update's micro-batches, no optimizer
            for rows in bucketed_micro_batches(mask, 0, budget):
                logp, _ = completion_logprobs(model.train(), ids[rows], mask[rows], T, with_entropy=True)
                (logp * g.completion_mask[rows]).sum().backward()
            model.zero_grad(set_to_none=True)

        _, s_fb = timed(fwd_bwd)
        rec["ref"].append(s_ref)
        rec["update"].append(s_update)
        rec["fwd_bwd"].append(s_fb)
        rec["step_peak"].append(rss.peak() - base)
        rec["peak"].append(peak)
        fb_flops = sum(forward_flops(model, mask[rows], T, backward=True) for rows in bucketed_micro_batches(mask, 0, budget))
        rec["fwd_bwd_mfu"].append(fb_flops / s_fb / peak)
        rec["ref_mfu"].append(forward_flops(model, mask, T, backward=False) / s_ref / peak)
    for k in rec:
        rec[k] = rec[k][1:]                                   # drop the warm-up
    med = lambda key, j=0: median([x[j] for x in rec[key]] if isinstance(rec[key][0], tuple) else rec[key])  # noqa: E731
    tok_s = lambda key: median([n / s for s, n in rec[key]])  # noqa: E731
    out = {
        "config": name, "threads": c["threads"], "G": c["G"], "prompts": c["prompts"], "new_tokens": c["new_tokens"],
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "vocab": model.config.vocab_size,
        "matmul_peak_gflops": med("peak") / 1e9,
        "rollout_s": med("ours"), "rollout_tok_s": tok_s("ours"), "generate_s": med("hf"), "generate_tok_s": tok_s("hf"),
        "rollout_tokens": med("ours", 1), "generate_tokens": med("hf", 1),
        "rollout_fixed_tok_s": tok_s("ours_fixed"), "generate_fixed_tok_s": tok_s("hf_fixed"),
        "ref_s": med("ref"), "update_s": med("update"), "fwd_bwd_s": med("fwd_bwd"),
        "ref_mfu": med("ref_mfu"), "fwd_bwd_mfu": med("fwd_bwd_mfu"),
        "step_s": med("ours") + med("ref") + med("update"),
        "step_peak_delta_mb": median(rec["step_peak"]),
        "peak_rss_mb": __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss / 1024,
    }
    out["rollout_speedup"] = out["rollout_tok_s"] / out["generate_tok_s"]
    out["rollout_fixed_speedup"] = out["rollout_fixed_tok_s"] / out["generate_fixed_tok_s"]
    rss.close()
    return out


def logits_memory(name: str, chunked: bool, rows: int, T: int, P: int = 24) -> dict:
    """Peak RSS increase (MiB) of one forward + backward over [rows, P + T] through the chunked
    LM head or the full-logits path (run in its own process)."""
    from grpo.modeling.logprobs import chunked_path, logits_path, split_model
    from grpo.modeling.models import load_policy

    torch.set_num_threads(2)
    model, tok = load_policy(str(model_dir(name)))
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, model.config.vocab_size, (rows, P + T), generator=g)
    mask = torch.ones_like(ids)
    rss = PeakRSS()
    for _ in range(2):                                       # the second pass is measured (allocator warm)
        rss.reset()
        base = rss.current()
        if chunked:
            logp, _ = chunked_path(split_model(model), ids, mask, T, 1.0, True, False)
        else:
            logp, _ = logits_path(model, ids, mask, T, 1.0, True, False)
        logp.sum().backward()
        model.zero_grad(set_to_none=True)
        del logp
    out = {"path": "chunked" if chunked else "full logits", "peak_delta_mb": rss.peak() - base}
    rss.close()
    return out


def child(args: list[str]) -> dict:
    """Run one measurement in a fresh process; returns its JSON result."""
    env = dict(os.environ, OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench/speed.py {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="embedded,qwen2-100m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_config(args.child, args.steps)))
        return
    if args.memory_child:
        print(json.dumps(logits_memory("qwen2-100m", args.memory_child == "chunked", rows=16, T=64)))
        return
    names = args.configs.split(",")
    for name in names:
        model_dir(name)
    rows = [child(["--child", name, "--steps", str(args.steps)]) for name in names]
    mem = [child(["--memory-child", kind]) for kind in ("chunked", "full", "chunked", "full")]
    memory = {k: median([m["peak_delta_mb"] for m in mem if m["path"] == k]) for k in ("chunked", "full logits")}
    print(f"steps: median of {args.steps} after 1 warm-up; threads: embedded 1, qwen2-100m 2")
    print_table(rows, ["config", "threads", "params_m", "rollout_tok_s", "generate_tok_s", "rollout_speedup",
                       "rollout_fixed_speedup", "rollout_s", "ref_s", "update_s", "step_s"])
    print_table(rows, ["config", "matmul_peak_gflops", "fwd_bwd_s", "fwd_bwd_mfu", "ref_mfu", "step_peak_delta_mb",
                       "peak_rss_mb"])
    print(f"qwen2-100m forward+backward, 16 x (24 + 64) tokens, peak RSS increase: chunked LM head "
          f"{memory['chunked']:.0f} MiB, full logits {memory['full logits']:.0f} MiB")
    path = write_results("speed", rows, {"steps": args.steps, "logits_memory_mb": memory})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
