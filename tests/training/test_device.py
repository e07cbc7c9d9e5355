"""Device neutrality: every tensor of a run is created on an explicit device (DESIGN.md, layer 2).

We have no GPU, so the classic works-on-CPU / breaks-on-GPU bug (a tensor created on torch's default
device meets the model's) is provoked with ``torch.set_default_device("meta")`` while the model stays
on the CPU: any tensor made without an explicit device lands on meta, and the run fails at once.
Models are built before the default device is switched; the switch is always undone.
"""

from __future__ import annotations

import ast
import contextlib
import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import grpo
import grpo.rollout.sampler as sampler_module
import grpo.modeling.shared_prompt as shared_prompt_module
from grpo.config import LoraConfig, build_config
from grpo.data.prompts import PromptStream, left_pad
from grpo.cpu.kernels import onednn_works
from grpo.modeling.lora import apply_lora
from grpo.modeling.models import build_model, build_tokenizer
from grpo.modeling.decoder import LeanDecoder
from grpo.api.trainer import train

#: Long relative to the 4-token completions, so the prompt-shared forward pays (>= 15 % of tokens saved).
SYSTEM_PROMPT = "solve the problem and answer with digits only, please."

REWARDS = '''
def digits_reward(prompts, completions, **kw):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]

def step_lengths(prompts, completions, steps, **kw):
    return [[float(len(s)) for s in st] for st in steps]
'''


@contextlib.contextmanager
def meta_default_device():
    """Tensors made without a device go to meta inside the block (torch's default restored after)."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def tiny_gpt2(tok) -> transformers.GPT2LMHeadModel:
    """A GPT-2 the lean decoder does not support: decoding goes through the model's own forward."""
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=128, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id))


def run_on_meta_default(tmp_path: Path, model, tok, **over):
    """Two GRPO steps (G = 4, 2 prompts, 4 new tokens) with meta as torch's default device.
    Returns (parameters before, TrainResult, metrics records)."""
    rewards = tmp_path / "rewards.py"
    rewards.write_text(REWARDS)
    flat = {"train.output_dir": str(tmp_path / "run"), "train.max_steps": 2, "train.prompts_per_step": 2,
            "rollout.num_generations": 4, "rollout.max_new_tokens": 4, "optim.lr": 1e-2,
            "cpu.num_threads": 1, "data.num_train_prompts": 8, "data.system_prompt": SYSTEM_PROMPT,
            "log.progress_bar": False, "train.save_final": True, "algorithm.beta": 0.04,
            "reward.functions": [f"{rewards}:digits_reward"], **over}
    cfg = build_config(overrides=flat)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with meta_default_device():
        result = train(cfg, model, tok)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return before, result, records


def changed(before: dict[str, torch.Tensor], model) -> list[str]:
    """Names of the parameters that differ from `before`."""
    return [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]


def spy(monkeypatch, module, name: str) -> list:
    """Record every return value of `module.name` (still called)."""
    seen, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    return seen


def test_full_finetuning_with_reference_copy_runs_on_a_meta_default_device(tmp_path, monkeypatch):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    decoders = spy(monkeypatch, sampler_module, "lean_decoder")
    shared = spy(monkeypatch, shared_prompt_module, "_expandable")   # called once the sharing pays; True: it ran
    before, result, records = run_on_meta_default(tmp_path, model, tok, **{
        "algorithm.top_entropy_rho": 0.5, "algorithm.overlong_cache_fraction": 0.5})
    assert result.steps == 2 and [r["step"] for r in records] == [1, 2]
    assert decoders and all(isinstance(d, LeanDecoder) for d in decoders)    # Qwen2: the lean decoder
    assert shared and all(shared)                                           # prompt-shared forward every time
    assert records[-1]["kl/mean"] is not None and records[-1]["kl/mean"] >= 0   # the frozen copy was used
    assert changed(before, result.model)
    assert all(p.device.type == "cpu" for p in result.model.parameters())
    saved = load_file(str(result.checkpoint / "model.safetensors"))
    assert result.checkpoint.name == "checkpoint-2"
    state = result.model.state_dict()
    assert saved and all(torch.equal(saved[k], state[k]) for k in saved)  # real weights, not meta


@pytest.mark.parametrize("mode", ["disk", "cpu"])
def test_an_offloaded_reference_runs_on_a_meta_default_device(tmp_path, mode):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    before, result, records = run_on_meta_default(tmp_path, model, tok, **{"train.ref_offload": mode})
    assert result.steps == 2 and records[-1]["kl/mean"] is not None and records[-1]["kl/mean"] >= 0
    assert changed(before, result.model)


def test_lora_runs_on_a_meta_default_device(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    _, result, records = run_on_meta_default(tmp_path, model, tok, **{"lora.enabled": True})
    assert result.steps == 2 and len(records) == 2
    lora_b = [p for n, p in result.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(bool(p.abs().sum() > 0) for p in lora_b)          # B starts at 0: the adapters learned
    assert records[-1]["kl/mean"] is not None                               # reference: adapters disabled
    assert all(p.device.type == "cpu" for p in result.model.parameters())
    assert (result.checkpoint / "model.safetensors").is_file()             # built in memory: saved merged


def test_hf_decoding_old_logprobs_process_reward_and_filters_run_on_a_meta_default_device(tmp_path, monkeypatch):
    tok = build_tokenizer()
    model = tiny_gpt2(tok)
    decoders = spy(monkeypatch, sampler_module, "lean_decoder")
    rewards = f"{tmp_path / 'rewards.py'}:step_lengths"
    before, result, records = run_on_meta_default(tmp_path, model, tok, **{
        "algorithm.num_iterations": 2, "algorithm.dynamic_sampling": True, "algorithm.gfpo_sample_size": 6,
        "algorithm.kl_in": "reward", "algorithm.overlong_cache_fraction": 0.5, "algorithm.entropy_coef": 0.01,
        "reward.process_functions": [rewards], "reward.step_delimiter": " "})
    assert decoders and all(d is None for d in decoders)                   # GPT-2: the model's own forward
    assert result.steps == 2 and "sampling/groups_drawn" in records[-1]
    assert records[-1]["kl/reward_penalty_mean"] is not None
    assert changed(before, result.model)
    assert (result.checkpoint / "model.safetensors").is_file()


def test_lora_adapters_are_created_on_the_model_device():
    model = build_model(build_tokenizer(), "micro", seed=0)
    with meta_default_device():
        peft_model = apply_lora(model, LoraConfig(enabled=True))
    devices = {n: p.device.type for n, p in peft_model.named_parameters() if "lora_" in n}
    assert devices and set(devices.values()) == {"cpu"}


def test_prompt_order_and_padding_do_not_depend_on_the_default_device():
    rows = [{"prompt": str(i)} for i in range(7)]
    with meta_default_device():
        got = [r["prompt"] for r in PromptStream(rows, seed=3).next(10)]
        ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    # torch.randperm(7, generator=cpu generator seeded 3) = [5, 3, 4, 6, 0, 2, 1], then the next epoch's
    assert got == ["5", "3", "4", "6", "0", "2", "1", "2", "6", "3"]
    assert got == [r["prompt"] for r in PromptStream(rows, seed=3).next(10)]       # as without meta
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]


def test_onednn_calibration_runs_on_the_cpu_whatever_the_default_device():
    expected = onednn_works.__wrapped__()
    with meta_default_device():
        assert onednn_works.__wrapped__() == expected     # a meta default must not switch oneDNN off for good


# ---------------------------------------------------------------- static guard

#: torch functions that create a tensor (or generator) on the default device unless given one.
FACTORIES = {"tensor", "as_tensor", "asarray", "zeros", "ones", "full", "empty", "empty_strided", "arange",
             "range", "linspace", "logspace", "eye", "rand", "randn", "randint", "randperm", "normal",
             "scalar_tensor", "tril_indices", "triu_indices", "Generator"}
PACKAGE = Path(grpo.__file__).parent


def factory_calls_without_device(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every ``torch.<factory>(...)`` call without a ``device=`` keyword
    (a ``**kwargs`` splat counts as without: the device must be visible at the call)."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)):
            found.append((node.lineno, node.func.attr))
    return found


def factories_imported_bare(tree: ast.AST) -> list[str]:
    """Factories imported by name (``from torch import zeros``), which the call scan would miss."""
    return [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "torch"
            for a in node.names if a.name in FACTORIES]


def test_the_scan_finds_factory_calls_without_a_device():
    tree = ast.parse("torch.zeros(3)\ntorch.zeros(3, device=x)\ntorch.Generator()\ntorch.full(s, 0, **kw)\n"
                     "y.new_zeros(3)\nfrom torch import arange\n")
    assert factory_calls_without_device(tree) == [(1, "zeros"), (3, "Generator"), (4, "full")]
    assert factories_imported_bare(tree) == ["arange"]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_tensor_factory_in_grpo_names_its_device(path):
    tree = ast.parse(path.read_text())
    assert factory_calls_without_device(tree) == [], "give each an explicit device (the model's, the batch's, or cpu)"
    assert factories_imported_bare(tree) == []
