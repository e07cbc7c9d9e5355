"""rollout.vllm.mode server: a real `grpo vllm-serve` subprocess (vLLM's CPU build, the embedded policy) and the
engine of grpo/rollout/engines/vllm_server.py against it; run in the vLLM venv (`make test-vllm`). One server
serves the module (it starts in 30-70 s on 2 shared cores); the kill-and-resume run goes last and restarts it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM venv (make test-vllm) runs these")

from grpo.config import LoraConfig, build_config  # noqa: E402
from grpo.modeling.models import EMBEDDED_MODEL_DIR, load_policy  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
SERVER_FLAGS = ["--dtype", "float32", "--max-model-len", "128", "--enforce-eager"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`grpo vllm-serve` on a free port, in its own process group (a kill takes its engine processes too)."""

    def __init__(self, log: Path):
        self.port, self.log, self.proc = free_port(), log, None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "grpo", "vllm-serve", "--port", str(self.port),
                                          *SERVER_FLAGS], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait(self, timeout: float = 400) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"grpo vllm-serve exited: {self.log.read_text()[-3000:]}"
            try:
                urllib.request.urlopen(self.url + "/v1/models", timeout=5).read()
                return
            except OSError:
                time.sleep(1)
        raise AssertionError(f"grpo vllm-serve not up after {timeout} s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("vllm-serve") / "server.log")
    s.start()
    try:
        s.wait()
        yield s
    finally:
        s.stop()


def server_config(port: int, **overrides):
    return build_config(None, {"rollout.engine": "vllm", "rollout.vllm.mode": "server",
                               "rollout.vllm.server_port": port, "rollout.vllm.server_timeout": 60, **overrides})


@torch.no_grad()
def policy_logprobs(model, ids: list[int], start: int) -> torch.Tensor:
    logits = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)        # [L, V]
    return logits[start - 1:-1].gather(-1, torch.tensor(ids[start:])[:, None])[:, 0]


def sequences(tok) -> list[tuple[list[int], int]]:
    """Fixed prompt + completion token ids, and where the completion starts."""
    pairs = [("12+34=", "46"), ("7*8=", "56"), ("(3+4)*2=", "14")]
    out = []
    for prompt, completion in pairs:
        p, c = tok(prompt)["input_ids"], tok(completion)["input_ids"] + [tok.eos_token_id]
        out.append((p + c, len(p)))
    return out


def perturb(model, scale: float = 0.05, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def served_logprobs(engine, tok) -> list[torch.Tensor]:
    """The server's log-probs of the fixed completions (prompt_logprobs: the raw distribution)."""
    seqs, start = zip(*sequences(tok))
    return [torch.tensor(lps) for lps in engine.prompt_logprobs(list(seqs), list(start))]


def check_synced(engine, model, tok, old: list[torch.Tensor]) -> None:
    engine.sync_weights(model)
    for (ids, start), got, before in zip(sequences(tok), served_logprobs(engine, tok), old):
        torch.testing.assert_close(got, policy_logprobs(model, ids, start), atol=2e-4, rtol=1e-4)
        assert (got - before).abs().max() > 0.05             # the old policy's log-probs are gone


def test_serve_argv_sets_up_weight_updates_and_passes_the_rest_through():
    from grpo.cli.vllm_serve import serve_argv
    from grpo.config import ConfigError
    from grpo.rollout.engines.vllm_transport import EXTENSION

    argv = serve_argv("m", ["--port", "9000", "--dtype=float32", "--enforce-eager"], cuda=False)
    assert argv[:2] == ["--model", "m"] and argv[-4:] == ["--port", "9000", "--dtype=float32", "--enforce-eager"]
    for flag in ("--logprobs-mode", "--worker-extension-cls", "--host", "--no-enable-chunked-prefill"):
        assert flag in argv
    assert argv[argv.index("--worker-extension-cls") + 1] == EXTENSION
    assert "--weight-transfer-config" in serve_argv("m", [], cuda=True)
    assert "--host" not in serve_argv("m", ["--host", "0.0.0.0"], cuda=False)[:-2]
    with pytest.raises(ConfigError, match="processed"):
        serve_argv("m", ["--logprobs-mode", "raw_logprobs"], cuda=False)
    with pytest.raises(ConfigError, match="chunk"):
        serve_argv("m", ["--enable-chunked-prefill"], cuda=False)


def test_the_nccl_weight_source_declares_what_it_sends():
    """CUDA's transport (not run here): vLLM's trainer engine sizes the workers' buffers from metadata() and sends
    what iteration yields; both must agree, in checkpoint names (a LoRA policy merged, a tied head once)."""
    from grpo.modeling.lora import apply_lora
    from grpo.rollout.engines.vllm_transport import _source

    base, _ = load_policy(EMBEDDED_MODEL_DIR)
    source = _source(apply_lora(base, LoraConfig(enabled=True, r=4, alpha=8)))
    declared = [(m.name, m.dtype, tuple(m.shape)) for m in source.metadata()]
    assert declared == [(n, t.dtype, tuple(t.shape)) for n, t in source]
    names = [n for n, _, _ in declared]
    assert len(names) == 50 and "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" not in names
    assert not any("lora" in n or "base_" in n for n in names) and source.groups()


def test_an_unreachable_server_is_one_line_naming_the_url():
    from grpo.rollout.engines.vllm_server import VllmServerError, build_server_engine

    model, tok = load_policy(EMBEDDED_MODEL_DIR)
    port = free_port()
    start = time.monotonic()
    with pytest.raises(VllmServerError) as e:
        build_server_engine(server_config(port, **{"rollout.vllm.server_timeout": 2}), model, tok, CPU)
    assert 2 <= time.monotonic() - start < 10                     # retried for server_timeout
    message = str(e.value)
    assert "\n" not in message and f"http://127.0.0.1:{port} is unreachable (connection refused" in message
    assert "grpo vllm-serve --model" in message and isinstance(e.value, OSError)


def test_a_server_of_another_model_is_refused(server):
    from grpo.rollout.engines.vllm_server import VllmServerError, build_server_engine

    other = ROOT / "grpo" / "assets" / "calculator-sft"
    model, tok = load_policy(other)
    with pytest.raises(VllmServerError, match=f"{server.url} serves .*arithmetic-sft, not this run's model"):
        build_server_engine(server_config(server.port, **{"model.path": str(other)}), model, tok, CPU)


def test_one_sync_puts_the_policys_weights_in_the_server(server):
    """After a sync the server's log-probs of fixed completions are the trainer's policy's, not the old
    policy's: every weight moved, the tied embedding / output head included."""
    from grpo.rollout.engines.vllm_server import build_server_engine

    model, tok = load_policy(EMBEDDED_MODEL_DIR)
    engine = build_server_engine(server_config(server.port), model, tok, CPU)     # pushes the weights once
    try:
        old = [policy_logprobs(model, ids, start) for ids, start in sequences(tok)]
        for got, want in zip(served_logprobs(engine, tok), old):
            torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
        perturb(model)
        check_synced(engine, model, tok, old)
    finally:
        engine.close()


def test_a_lora_policy_syncs_merged(server):
    from grpo.modeling.lora import apply_lora
    from grpo.rollout.engines.vllm_server import build_server_engine

    base, tok = load_policy(EMBEDDED_MODEL_DIR)
    model = apply_lora(base, LoraConfig(enabled=True, r=4, alpha=8))
    engine = build_server_engine(server_config(server.port), model, tok, CPU)
    try:
        old = [policy_logprobs(model, ids, start) for ids, start in sequences(tok)]
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
        check_synced(engine, model, tok, old)
    finally:
        engine.close()


def test_samples_carry_processed_logprobs_and_repeat_per_prompt_seed(server):
    from grpo.rollout.engines.vllm_server import build_server_engine
    from grpo.rollout.params import SamplingParams

    model, tok = load_policy(EMBEDDED_MODEL_DIR)
    engine = build_server_engine(server_config(server.port), model, tok, CPU)
    try:
        batch = tok(["12+34=", "7*8=", "9-5="], padding=True, padding_side="left", return_tensors="pt")
        params = SamplingParams(n=3, temperature=0.7, top_k=8, max_tokens=12, stop_token_ids=(tok.eos_token_id,),
                                seed=5)
        gen = engine.generate(batch["input_ids"], batch["attention_mask"], params, prompt_index=torch.tensor([4, 7, 9]))
        assert gen.completion_ids.shape[0] == 9 and gen.completion_mask.sum() > 0
        ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
        mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        logits = logits[:, gen.prompt_ids.size(1) - 1:-1].float() / 0.7                  # [N, T, V]
        kth = logits.topk(8, dim=-1).values[..., -1:]
        processed = logits.masked_fill(logits < kth, float("-inf")).log_softmax(-1)
        want = processed.gather(-1, gen.completion_ids[..., None])[..., 0].where(gen.completion_mask.bool(), 0.0)
        torch.testing.assert_close(gen.sampling_logprobs, want, atol=2e-4, rtol=1e-4)
        ended = gen.completion_ids.gather(1, gen.completion_mask.sum(1, keepdim=True) - 1)[:, 0] == tok.eos_token_id
        assert torch.equal(gen.truncated, ~ended)
        alone = engine.generate(batch["input_ids"][1:2], batch["attention_mask"][1:2], params,
                                prompt_index=torch.tensor([7]))                     # the same group in another batch
        T = alone.completion_ids.size(1)
        assert torch.equal(alone.completion_ids, gen.completion_ids[3:6, :T])
    finally:
        engine.close()


def train_argv(out: Path, port: int, steps: int) -> list[str]:
    return [sys.executable, "-m", "grpo", "train", "--output-dir", str(out), "--max-steps", str(steps),
            "--rollout.engine", "vllm", "--rollout.vllm.mode", "server", "--rollout.vllm.server_port", str(port),
            "--rollout.vllm.server_timeout", "20", "--train.prompts_per_step", "2", "--rollout.num_generations", "4",
            "--rollout.max_new_tokens", "16", "--train.save_steps", "1", "--cpu.num_threads", "1",
            "--log.progress_bar", "false"]


def test_training_stops_in_one_line_when_the_server_dies_and_resumes_on_a_new_one(server, tmp_path):
    """Kill the server mid-run: the trainer exits 2 with one line naming the URL; restart it: --train.resume auto
    finishes the run from the last checkpoint."""
    out, steps = tmp_path / "run", 8
    run = subprocess.Popen(train_argv(out, server.port, steps), cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 300
    while not (out / "checkpoint-2").exists() and run.poll() is None and time.monotonic() < end:
        time.sleep(0.1)
    assert run.poll() is None, f"the run ended before the kill: {run.communicate()}"
    server.kill()
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 2, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the vLLM server at {server.url} stopped answering"), stderr
    assert "grpo vllm-serve --model" in last
    kept = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert kept and kept[-1] < steps

    server.start()
    server.wait()
    done = subprocess.run(train_argv(out, server.port, steps) + ["--train.resume", "auto"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"done: {steps} steps" in done.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert records[-1]["step"] == steps
    assert max(r["rollout/logprob_diff"] for r in records if r["step"] > kept[-1]) < 1e-4   # synced every step
