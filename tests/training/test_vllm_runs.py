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
