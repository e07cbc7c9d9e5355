"""What holds for a run whose rollouts come from vLLM (docs/engines.md), on vLLM's CPU build (`make test-vllm`):
the same seed repeats the run, and SIGKILL then --resume ends where the uninterrupted run ends: the same
samples, metrics and final weights, bit for bit (vLLM's CPU kernels are deterministic, every prompt group has
its own keyed seed, and the resumed engine starts from the checkpoint's weights)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vLLM venv (make test-vllm) runs these")

from grpo.modeling.models import EMBEDDED_MODEL_DIR  # noqa: E402
from tests.run_helpers import assert_same_run, make_reward, run_subprocess, tiny_config  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
VLLM = {"rollout.engine": "vllm", "rollout.vllm.kv_cache_gb": 0.25, "rollout.vllm.max_model_length": 64,
        "train.max_steps": 4}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm-run")
    return EMBEDDED_MODEL_DIR, make_reward(d), d          # head_dim 32 (vLLM's CPU attention has no 16: the micro model)


def test_sigkill_then_resume_with_vllm_is_bit_identical_to_the_uninterrupted_run(env):
    model_dir, reward, d = env
    plain = tiny_config(model_dir, reward, d / "plain", **VLLM)
    first = run_subprocess(plain)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "rollout engine vllm" in first.stdout
    again = tiny_config(model_dir, reward, d / "again", **VLLM)
    assert run_subprocess(again).returncode == 0
    assert_same_run(d / "plain", d / "again", 4)                     # the same seed repeats the run
    killed = tiny_config(model_dir, reward, d / "killed", **VLLM)
    cut = run_subprocess(killed, kill_at="update:3")                 # SIGKILL in step 3's update
    assert cut.returncode != 0
    resumed = run_subprocess(killed, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_run(d / "plain", d / "killed", 4)


def test_two_ranks_with_colocated_vllm_engines_sample_what_one_process_samples(env):
    """torchrun, 2 ranks, each with its own colocated vLLM engine (vLLM's external_launcher) on its half of the
    prompts: the first step, before any update, scores exactly the completions one process samples (per-prompt
    seeds; vLLM's CPU kernels are batch-invariant), and the run ends with both ranks done."""
    import sys

    from tests.run_helpers import records, train_command

    model_dir, reward, d = env
    one = tiny_config(model_dir, reward, d / "one", **{**VLLM, "train.max_steps": 2})
    assert run_subprocess(one).returncode == 0
    two = tiny_config(model_dir, reward, d / "two", **{**VLLM, "train.max_steps": 2})
    argv, env_vars = train_command(two)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *argv[1:]]
    import subprocess

    from tests.run_helpers import ROOT

    done = subprocess.run(argv, cwd=ROOT, env=env_vars, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = records(d / "one")[0], records(d / "two")[0]
    sampled = [k for k in a if k.startswith(("reward/", "completion/"))]
    assert sampled and {k: a[k] for k in sampled} == {k: b[k] for k in sampled}
    assert [r["step"] for r in records(d / "two")] == [1, 2]
