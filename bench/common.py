"""Shared pieces of the benchmarks: locally built models with a realistic vocabulary, and tables."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

RESULTS = Path(__file__).resolve().parent / "results"

#: Qwen2-style shapes (hidden, layers, heads, kv heads, intermediate), vocabulary 32,768.
SHAPES: dict[str, dict[str, int]] = {
    "qwen2-57m": dict(hidden_size=576, num_hidden_layers=10, num_attention_heads=9, num_key_value_heads=3,
                      intermediate_size=1728),
    "qwen2-100m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                       intermediate_size=2048),
}
VOCAB = 32768


def wide_tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    """The embedded character tokenizer grown to `vocab_size` with filler tokens `<w0>`, `<w1>`, ...

    Prompts of the embedded task tokenize exactly as before; sampled filler tokens decode to text.
    """
    from tokenizers import AddedToken

    from grpo.modeling.models import build_tokenizer

    tok = build_tokenizer(model_max_length=4096)
    tok.add_tokens([AddedToken(f"<w{i}>", normalized=False) for i in range(vocab_size - len(tok))])
    return tok


def build_bench_model(name: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Build (once) and save a randomly initialised Qwen2 of shape `name`; returns its directory."""
    return build_qwen2(SHAPES[name], VOCAB, Path(out_dir) / name, seed)


def build_qwen2(shape: dict[str, int], vocab_size: int, out: Path, seed: int = 0) -> Path:
    """Build (once) and save a randomly initialised, tied-embedding Qwen2 of `shape` (Qwen2Config's size
    keys) with the wide tokenizer of `vocab_size` tokens in `out`; returns `out`."""
    if (out / "config.json").is_file():
        return out
    tok = wide_tokenizer(vocab_size)
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), max_position_embeddings=4096, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None, **shape)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                               bos_token_id=None)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def count_params(model_dir: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def machine() -> dict[str, Any]:
    import os

    return {"python": sys.version.split()[0], "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform()}


def write_results(name: str, rows: list[dict[str, Any]], extra: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **extra, "rows": rows}, indent=2))
    return path


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)) for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)


def median(values: list[float]) -> float:
    import statistics

    return float(statistics.median(values))


def matmul_peak_flops(threads: int, n: int = 2048, repeats: int = 7) -> float:
    """This machine's float32 matrix-multiply rate (FLOP/s) at `threads` threads: the better of
    PyTorch's default GEMM (MKL) and oneDNN's (grpo.cpu.kernels), each the median of `repeats` products
    of two [n, n] matrices (2 n^3 FLOPs each) after one warm-up. On AMD CPUs oneDNN's AVX-512 GEMM
    is ~2x MKL's, so the peak is the oneDNN rate there."""
    import time

    from grpo.cpu.kernels import onednn_linear, onednn_works

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    kernels = [lambda: torch.matmul(a, b)] + ([lambda: onednn_linear(a, b)] if onednn_works() else [])
    rates = []
    for fn in kernels:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rates.append(2 * n ** 3 / median(times))
    torch.set_num_threads(previous)
    return max(rates)


class PeakRSS:
    """Peak resident memory (MiB) of this process between `reset()` and `peak()`, sampled every 2 ms
    by a daemon thread (torch kernels release the GIL, so sampling goes on during them)."""

    def __init__(self, interval_s: float = 0.002):
        import threading

        import psutil

        self._proc, self._interval, self._max = psutil.Process(), interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._max = max(self._max, self._proc.memory_info().rss)
            self._stop.wait(self._interval)

    def current(self) -> float:
        return self._proc.memory_info().rss / 2 ** 20

    def reset(self) -> None:
        self._max = self._proc.memory_info().rss

    def peak(self) -> float:
        self._max = max(self._max, self._proc.memory_info().rss)
        return self._max / 2 ** 20

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def arithmetic_rows(n: int, tokenizer=None, seed: int = 0) -> list[dict[str, Any]]:
    """`n` prompt rows of the embedded arithmetic task (train split), tokenized when a tokenizer is
    given, exactly as the trainer's data pipeline builds them."""
    from grpo.config import build_config
    from grpo.data.prompts import load_prompt_rows

    cfg = build_config(overrides={"data.num_train_prompts": n})
    return load_prompt_rows(cfg.data, seed, tokenizer)[:n]
