import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(vocab_size: int = 32, seed: int = 0) -> Qwen2ForCausalLM:
    """A ~20k-parameter Qwen2 built from a config (nothing downloaded)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                      pad_token_id=0, eos_token_id=1, bos_token_id=None)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture
def tiny_model():
    return tiny_qwen2()


@pytest.fixture(autouse=True)
def cpu_model_hooks():
    """Every test runs with the CPU runtime's model-code hooks in force (grpo.cpu.hooks, as a CPU run has them after
    ``CpuRuntime.prepare_process``; a test's CudaRuntime puts the plain ones in), and leaves the previous ones."""
    from grpo.modeling.hooks import install
    from grpo.training.cpu_runtime import install_hooks

    previous = install(None)
    yield install_hooks()
    install(previous)


class ScalarReads:
    """Counts the device-to-host scalar reads (``aten._local_scalar_dense``: ``float()``, ``.item()``) made while
    it is active, by code whose innermost grpo frame is in one of `files` (path suffixes): on a GPU each one stalls
    the host until the queued kernels have run. ``with ScalarReads("training/update.py") as reads: ...``;
    then ``reads.count``."""

    def __init__(self, *files: str):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self
        self.files, self.count = files, 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._local_scalar_dense.default:
                    outer._seen()
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def _seen(self) -> None:
        import traceback

        ours = [f.filename for f in traceback.extract_stack() if "/grpo/" in f.filename]
        if ours and ours[-1].endswith(self.files):
            self.count += 1

    def __enter__(self) -> "ScalarReads":
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)


#: `make test-vllm` sets GRPO_REQUIRE_VLLM=1: there a vllm-marked test that skips (vLLM failed to import, say)
#: fails the run instead of passing unseen.
_SKIPPED_VLLM: list[str] = []


def pytest_runtest_logreport(report):
    import os

    if os.environ.get("GRPO_REQUIRE_VLLM") == "1" and report.skipped and "vllm" in report.keywords:
        _SKIPPED_VLLM.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED_VLLM:
        print(f"\nGRPO_REQUIRE_VLLM: {len(_SKIPPED_VLLM)} vLLM test(s) skipped: {', '.join(_SKIPPED_VLLM)}")
        session.exitstatus = 1
