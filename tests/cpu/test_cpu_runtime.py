"""The CPU runtime owns grpo.cpu: its hooks reach the model code, the other runtimes never build or load the native
library, and the native kernels are torch operators (meta / fake tensors, the profiler)."""

import subprocess
import sys
import textwrap

import pytest
import torch

from grpo.cpu import native_elementwise, native_gemm, native_library
from grpo.modeling import hooks
from tests.conftest import tiny_qwen2

needs_kernel = pytest.mark.skipif(native_gemm.library() is None,
                                  reason=f"native kernels: {native_gemm.unavailable_reason()}")

#: Run in a fresh process (the library is loaded once per process and cached): the CUDA runtime's set-up, placing,
#: a forward and backward pass and the fused head on the meta device, with the compiler and ctypes' loader watched.
CUDA_SETUP = textwrap.dedent('''
    import ctypes, subprocess, sys, torch
    compiles, loads = [], []
    real_run, real_cdll = subprocess.run, ctypes.CDLL
    subprocess.run = lambda *a, **k: compiles.append(a[0]) or real_run(*a, **k)
    ctypes.CDLL = lambda name, *a, **k: loads.append(str(name)) or real_cdll(name, *a, **k)
    torch.cuda.is_available = lambda: True                      # a CUDA machine, as far as grpo asks
    from grpo.accelerator import MetaAccelerator
    from grpo.config import build_config
    from grpo.cpu import native_gemm, native_library
    from grpo.modeling import hooks
    from grpo.modeling.fused_head import head_logprobs
    from grpo.training.runtime import CudaRuntime, meta_runtime
    from tests.conftest import tiny_qwen2

    cfg = build_config()
    CudaRuntime(torch.device("cuda", 0), cfg, MetaAccelerator()).prepare_process()
    runtime = meta_runtime(cfg)
    runtime.prepare_process()
    model = runtime.place(tiny_qwen2())
    ids = torch.randint(0, 32, (2, 7), device="meta")
    model(input_ids=ids).logits.sum().backward()
    h = torch.randn(6, model.config.hidden_size, device="meta", requires_grad=True)
    logp, ent = head_logprobs(model.lm_head, h, torch.zeros(6, dtype=torch.long, device="meta"), 1.0, True, 4)
    (logp.sum() + ent.sum()).backward()
    import json
    print(json.dumps([native_library._load.cache_info().currsize, len(compiles),
                      sum("decode_gemm" in n for n in loads), sorted(set(native_gemm._modes.values())),
                      type(hooks.installed()).__name__, model.config._attn_implementation]))
''')


def test_the_cuda_runtime_neither_builds_nor_loads_the_native_library(tmp_path):
    """CudaRuntime.prepare_process turns every native mode off and keeps the plain hooks; its model code on meta
    (forward, backward, the fused head) never calls the library: no compile, no load, the loader's cache empty."""
    env = {"GRPO_KERNEL_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CUDA_SETUP], capture_output=True, text=True, env=env, timeout=300,
                         cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert out.returncode == 0, out.stderr[-2000:]
    cached, compiled, loaded, modes, installed, attention = __import__("json").loads(out.stdout.splitlines()[-1])
    assert (cached, compiled, loaded) == (0, 0, 0)                      # no _load call, no subprocess, no CDLL
    assert modes == ["onednn", "torch"]
    assert installed == "ModelHooks" and attention == "sdpa"
    assert list(tmp_path.iterdir()) == []                                  # nothing written to the kernel cache


def test_device_is_tested_before_the_library(monkeypatch):
    """The predicates ask about the tensors first: meta (or CUDA) tensors never reach native_library's loader."""
    from grpo.cpu import kernels, native_attention

    monkeypatch.setattr(native_library, "_load", lambda: pytest.fail("the library was asked for"))
    m = torch.empty(4, 8, device="meta")
    assert not native_elementwise.applies(m, m)
    assert not kernels.native_grads(m, m, m)
    assert not native_attention._qualifies(None, *(torch.empty(1, 2, 3, 4, device="meta"),) * 3, None, 0.0, {})


def test_cpu_runtime_installs_its_hooks_and_the_cuda_runtime_the_plain_ones(monkeypatch):
    from grpo.accelerator import MetaAccelerator
    from grpo.config import build_config
    from grpo.cpu.hooks import CpuHooks
    from grpo.training.runtime import CpuRuntime, CudaRuntime

    monkeypatch.setattr(native_gemm, "_modes", dict(native_gemm._modes))
    cfg = build_config(overrides={"cpu.num_threads": torch.get_num_threads()})
    CpuRuntime(torch.device("cpu"), cfg).prepare_process()
    assert isinstance(hooks.installed(), CpuHooks) and hooks.installed().elementwise is native_elementwise
    CudaRuntime(torch.device("meta"), cfg, MetaAccelerator()).prepare_process()
    assert type(hooks.installed()) is hooks.ModelHooks and hooks.installed().elementwise is None
    assert native_gemm._modes == {"decode": "onednn", "grad": "onednn", "elementwise": "torch", "attention": "torch"}


def test_plain_hooks_give_the_cpu_hooks_values():
    """The model code with the plain hooks (any device) and with the CPU runtime's (oneDNN, native kernels, kept
    buffers) computes the same log-probs and gradients, to float32 rounding."""
    from grpo.config import build_config
    from grpo.modeling.logprobs import completion_logprobs
    from grpo.training.runtime import CpuRuntime

    torch.manual_seed(0)
    base = tiny_qwen2()
    ids = torch.randint(1, 32, (3, 10))
    mask = torch.ones_like(ids)
    results = []
    for cpu in (False, True):
        model = __import__("copy").deepcopy(base)
        if cpu:
            runtime = CpuRuntime(torch.device("cpu"), build_config(overrides={"cpu.cpu_matmul": "onednn",
                                                                              "train.lean_layers": True}))
            model = runtime.place(model)
        else:
            hooks.install(None)
        logp, _ = completion_logprobs(model, ids, mask, 4)
        logp.sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_native_operators_run_under_meta_and_fake_tensors():
    """Every grpo operator has a fake implementation: shapes (and dtypes) come out without the library."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = torch.ops.grpo
    for mode in ("meta", "fake"):
        ctx = FakeTensorMode() if mode == "fake" else torch.device("meta")
        with ctx:
            x, w = torch.empty(5, 40), torch.empty(40)
            assert ops.panel_pack(torch.empty(33, 40)).shape == (3, 40, 16)
            assert ops.panel_matmul(x, torch.empty(3, 40, 16), 33, None).shape == (5, 33)
            assert ops.grad_accumulate_(torch.empty(40, 40), x, x, False) is None
            assert ops.swiglu_forward(x, x).shape == (5, 40)
            assert [t.shape for t in ops.swiglu_backward_(x, x, x)] == [(5, 40), (5, 40)]
            assert ops.log_softmax_rows_(x, torch.empty(5), None, True) is None
            y, r = ops.rms_norm_forward(x, w, 1e-6)
            assert y.shape == (5, 40) and r.shape == (5, 1)
            gx, gw = ops.rms_norm_backward(x, x, w, r, True, False)
            assert gx.shape == (5, 40) and gw.shape == (0,)
            q, kv = torch.empty(2, 4, 9, 8), torch.empty(2, 2, 9, 8)
            o, lse = ops.attention_forward(q, kv, kv, None, 0.35)
            assert o.shape == (2, 9, 4, 8) and lse.shape == (2, 4, 9)
            dq, dk, dv = ops.attention_backward(q, kv, kv, None, 0.35, o, o, lse)
            assert dq.shape == q.shape and dk.shape == dv.shape == kv.shape


@needs_kernel
def test_native_operators_show_in_the_profiler_and_pass_opcheck():
    g = torch.Generator().manual_seed(0)
    x, u = torch.randn(6, 32, generator=g), torch.randn(6, 32, generator=g)
    with torch.profiler.profile() as prof:
        native_elementwise.swiglu_forward(x, u)
        native_elementwise.rms_norm_forward(x, torch.ones(32), 1e-6)
    names = {e.key for e in prof.key_averages()}
    assert {"grpo::swiglu_forward", "grpo::rms_norm_forward"} <= names
    torch.library.opcheck(torch.ops.grpo.swiglu_forward.default, (x, u))
    torch.library.opcheck(torch.ops.grpo.swiglu_backward_.default, (x, u, torch.randn(6, 32, generator=g)))
    torch.library.opcheck(torch.ops.grpo.rms_norm_forward.default, (x, torch.ones(32), 1e-6))
    torch.library.opcheck(torch.ops.grpo.grad_accumulate_.default, (torch.zeros(32, 32), x, u, False))
