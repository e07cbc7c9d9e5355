"""The update's forward+backward against the machine's GEMM peak, and its peak memory, by layer kind and
micro-batch size.

    .venv/bin/python bench/update_peak.py [--configs autograd-256,default-256,...,hf-full] [--rounds 2]

One forward+backward of the qwen2-100m fixture (bench/common.py) over 16 rows x (24 prompt + 64 completion)
tokens, as the update runs it: log-probs and entropy of the completion tokens through the chunked LM head,
rows in token-budget micro-batches (grpo.modeling.logprobs.bucketed_micro_batches), gradients accumulated,
2 threads, `cpu.cpu_matmul: auto`, glibc's own mmap threshold as `grpo train` leaves it (cpu.mmap_threshold_mb = 0,
the default since 2026-11-25) unless a configuration says otherwise, and (all but autograd-256, hf-full and
lean-256-nobuf) the gradients as views of one flat buffer made at the start of each timed pass, as the update makes
it (cpu.grad_buffer, on 2 MiB pages: cpu.huge_pages). Configurations, each a fresh process, alternating over `--rounds`:

* autograd-256: stock Hugging Face layers, weight gradients through autograd (cpu.grad_in_place false),
  256-token micro-batches, mmap threshold 1 MiB: the defaults before 2026-11-25;
* default-256: the defaults: weight gradients accumulated in place (cpu.grad_in_place, GradIntoLinear),
  the default micro-batch (256 tokens), glibc's own mmap threshold;
* mmap1-256: the same with cpu.mmap_threshold_mb = 1 (the default before 2026-11-25);
* lean-256: the same with train.lean_layers (grpo/modeling/lean_layers.py), the defaults since 2026-11-27; weight
  gradients by `cpu.grad_kernel: auto` (grpo's native kernel on AVX-512 since 2026-11-28, oneDNN before);
* lean-256-onednn: the same with `cpu.grad_kernel: onednn` (products in blocks, then added);
* lean-256-small-pages: lean-256 with `cpu.huge_pages: false` (the gradient buffer in 4 KiB pages);
* lean-256-nobuf: lean-256 with `cpu.grad_buffer: false` (gradients made one by one in the first backward, as
  this benchmark ran every configuration before 2026-11-28's later session);
* lean-256-torch-ops: lean-256 with `cpu.elementwise_kernel: torch` and `cpu.attention_kernel: torch`
  (torch's elementwise operators and transformers' sdpa, the defaults before 2026-11-28; since then grpo's
  native passes, grpo/cpu/native_elementwise.py and native_attention.py, where they build);
* default-704 / lean-704: 704-token micro-batches (8 rows);
* default-704-mmap1: the same with cpu.mmap_threshold_mb = 1;
* hf-full: a plain Hugging Face forward+backward of the whole batch at once (full logits, log-softmax,
  stock layers and aten linears, glibc's own threshold): the issue's reference point.

FLOPs are bench/speed.py's model FLOPs (recomputation not counted); the peak is the faster of MKL's and
oneDNN's [2048, 2048] float32 GEMM, measured in the same process right before each timed pass. Peak RSS is
the increase over the loaded model during the two timed passes (gradients included). Writes
bench/results/update_peak.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: name: train.lean_layers (lean), micro-batch tokens (tokens; -1: the whole batch in one plain pass),
#: cpu.mmap_threshold_mb (mmap), cpu.grad_in_place (in_place), and, default auto / on, cpu.grad_kernel (grad),
#: cpu.elementwise_kernel and cpu.attention_kernel (ops), cpu.grad_buffer (buffer), cpu.huge_pages (huge)
CONFIGS = {"autograd-256": dict(lean=False, tokens=256, mmap=1, in_place=False, buffer=False),
           "default-256": dict(lean=False, tokens=0, mmap=0, in_place=True),
           "mmap1-256": dict(lean=False, tokens=0, mmap=1, in_place=True),
           "lean-256": dict(lean=True, tokens=0, mmap=0, in_place=True),
           "lean-256-onednn": dict(lean=True, tokens=0, mmap=0, in_place=True, grad="onednn"),
           "lean-256-torch-ops": dict(lean=True, tokens=0, mmap=0, in_place=True, ops="torch"),
           "lean-256-small-pages": dict(lean=True, tokens=0, mmap=0, in_place=True, huge=False),
           "lean-256-nobuf": dict(lean=True, tokens=0, mmap=0, in_place=True, buffer=False),
           "default-704": dict(lean=False, tokens=704, mmap=0, in_place=True),
           "lean-704": dict(lean=True, tokens=704, mmap=0, in_place=True),
           "default-704-mmap1": dict(lean=False, tokens=704, mmap=1, in_place=True),
           "hf-full": dict(lean=False, tokens=-1, mmap=0, in_place=False, buffer=False)}
ROWS, PROMPT, NEW = 16, 24, 64


def child(name: str) -> dict:
    import torch

    from bench.common import PeakRSS, build_bench_model, matmul_peak_flops
    from bench.speed import MODELS_DIR, forward_flops
    from grpo.cpu import native_gemm
    from grpo.cpu.grad_in_place import gradient_buffer
    from grpo.cpu.heap import set_mmap_threshold, use_huge_pages
    from grpo.cpu.placement import use_cpu_matmul
    from grpo.modeling.lean_layers import use_lean_layers
    from grpo.modeling.logprobs import bucketed_micro_batches, completion_logprobs
    from grpo.modeling.models import load_policy
    from grpo.cpu.native_attention import use_native_attention
    from grpo.training.cpu_runtime import install_hooks, micro_batch_tokens

    c = {"grad": "auto", "ops": "auto", "buffer": True, "huge": True, **CONFIGS[name]}
    lean, tokens, mmap_mb, in_place, grad_kernel, ops_kernel = (c[k] for k in ("lean", "tokens", "mmap", "in_place",
                                                                               "grad", "ops"))
    native_gemm.configure(grad=grad_kernel, elementwise=ops_kernel, attention=ops_kernel)
    use_huge_pages(c["huge"])
    torch.set_num_threads(2)
    set_mmap_threshold(mmap_mb)
    model, _ = load_policy(str(build_bench_model("qwen2-100m", MODELS_DIR)))
    use_lean_layers(model, lean)
    install_hooks()                                           # the CPU runtime's model-code hooks
    use_cpu_matmul(model, "aten" if tokens < 0 else "auto", grad_in_place=in_place)
    use_native_attention(model, tokens >= 0)                         # as the CPU runtime places the policy
    model.train()
    budget = micro_batch_tokens(tokens, model) if tokens >= 0 else -1
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 30000, (ROWS, PROMPT + NEW), generator=gen)
    mask = torch.ones_like(ids)
    params = [p for p in model.parameters() if p.requires_grad]

    def fwd_bwd():
        if c["buffer"]:
            gradient_buffer(params)                  # as the update starts (cpu.grad_buffer), inside the timing
        if budget < 0:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, PROMPT - 1:-1].float()
            torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT:, None]).sum().backward()
        else:
            for rows in bucketed_micro_batches(mask, 0, budget):
                logp, _ = completion_logprobs(model, ids[rows], mask[rows], NEW, with_entropy=True)
                logp.sum().backward()
        model.zero_grad(set_to_none=True)

    fwd_bwd()                                                         # warm-up
    flops = forward_flops(model, mask, NEW, backward=True)
    rss = PeakRSS()
    base = rss.current()
    fractions, seconds = [], []
    for _ in range(2):
        peak = matmul_peak_flops(2, repeats=3)
        t0 = time.perf_counter()
        fwd_bwd()
        seconds.append(time.perf_counter() - t0)
        fractions.append(flops / seconds[-1] / peak)
    out = {"config": name, "lean_layers": lean, "micro_batch_tokens": budget, "mmap_threshold_mb": mmap_mb,
           "grad_in_place": in_place, "grad_kernel": grad_kernel, "ops_kernel": ops_kernel,
           "grad_buffer": c["buffer"], "huge_pages": c["huge"],
           "fwd_bwd_s": min(seconds),
           "fraction_of_peak": max(fractions), "peak_delta_mb": rss.peak() - base}
    rss.close()
    return out


def main() -> None:
    from bench.common import median, print_table, write_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="update_peak", help="results file in bench/results (no .json)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child)))
        return
    names = args.configs.split(",")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                raise SystemExit(f"bench/update_peak.py: child {name} failed:\n{proc.stderr[-2000:]}")
            runs[name].append(json.loads(line[0][7:]))
            print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    rows = []
    for name in names:
        rs = runs[name]
        rows.append({"config": name, "micro_batch_tokens": rs[0]["micro_batch_tokens"],
                     "grad_in_place": rs[0]["grad_in_place"],
                     "mmap_threshold_mb": rs[0]["mmap_threshold_mb"],
                     "fwd_bwd_s": median([x["fwd_bwd_s"] for x in rs]),
                     "fraction_of_peak": median([x["fraction_of_peak"] for x in rs]),
                     "peak_delta_mb": median([x["peak_delta_mb"] for x in rs])})
    print_table(rows, ["config", "micro_batch_tokens", "mmap_threshold_mb", "grad_in_place", "fwd_bwd_s",
                       "fraction_of_peak", "peak_delta_mb"])
    write_results(args.out, rows, {"rounds": args.rounds, "runs": runs})


if __name__ == "__main__":
    main()
