"""Parameters kept off the compute device between uses (grpo/modeling/offload.py, `train.ref_offload`): the stores
give back the stored bytes, the module holds empty tensors between uses, ties survive, nothing is left on disk."""

from __future__ import annotations

import os

import pytest
import torch

from grpo.modeling.offload import DiskStore, HostStore, Offloaded, tensor_bytes, unique_parameters
from tests.conftest import tiny_qwen2

CPU = torch.device("cpu")


def tensors():
    g = torch.Generator(device="cpu").manual_seed(0)
    return [torch.randn(3, 5, generator=g, device="cpu"),
            torch.randn(7, generator=g, device="cpu").to(torch.bfloat16),   # no numpy dtype: stored as bytes
            torch.arange(4, device="cpu").reshape(2, 2),                    # int64
            torch.tensor(2.5, device="cpu"),                                # 0-dim
            torch.empty(0, 3, device="cpu"),                                # no bytes at all
            torch.randn(4, 6, generator=g, device="cpu").t()]               # not contiguous


@pytest.mark.parametrize("store", [DiskStore, HostStore])
def test_a_store_gives_back_the_bytes(store, tmp_path):
    src = tensors()
    s = store(src, str(tmp_path))
    assert s.nbytes == tensor_bytes(src) == 15 * 4 + 7 * 2 + 4 * 8 + 4 + 0 + 24 * 4
    for i, t in enumerate(src):
        out = s.load(i, CPU)
        assert out.dtype == t.dtype and out.shape == t.shape and out.device == CPU
        assert torch.equal(out.view(-1).view(torch.uint8) if out.numel() else out,
                           t.contiguous().view(-1).view(torch.uint8) if t.numel() else t)
        if t.numel():
            out.add_(1)                                                     # a load is a new tensor, not the store's
            assert torch.equal(s.load(i, CPU), t)


def test_the_disk_store_leaves_no_file_behind(tmp_path):
    s = DiskStore(tensors(), str(tmp_path / "ref"))
    assert os.listdir(tmp_path / "ref") == []                               # unlinked at creation
    assert os.fstat(s.file.fileno()).st_size == s.nbytes


def test_a_short_file_is_an_error_naming_the_option(tmp_path):
    s = DiskStore([torch.ones(8, device="cpu")], str(tmp_path))
    s.file.truncate(16)
    with pytest.raises(OSError, match="ref_offload: the reference's weight file ended at byte 16"):
        s.load(0, CPU)


def test_offloaded_module_is_empty_between_uses_and_exact_inside():
    model = tiny_qwen2(seed=3)
    model.lm_head.weight = model.model.embed_tokens.weight                 # a tied head: stored once
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = unique_parameters(model)
    assert len(params) == len(expected)                                      # named_parameters lists the tie once too
    off = Offloaded(model, "disk")
    assert off.nbytes == sum(t.numel() * 4 for t in expected.values())
    assert all(p.numel() == 0 for p in model.parameters())                  # nothing resident
    with off.resident() as m:
        assert m is model and model.lm_head.weight is model.model.embed_tokens.weight
        for n, p in model.named_parameters():
            assert torch.equal(p, expected[n])
    assert all(p.numel() == 0 for p in model.parameters())
    with pytest.raises(RuntimeError, match="boom"):                          # emptied even when the block fails
        with off.resident():
            raise RuntimeError("boom")
    assert all(p.numel() == 0 for p in model.parameters())


def test_unknown_store_is_refused():
    with pytest.raises(ValueError, match="train.ref_offload: no store 'gpu'"):
        Offloaded(tiny_qwen2(), "gpu")


def test_a_hollow_copy_holds_no_weights_and_keeps_ties_and_buffers():
    from grpo.modeling.offload import hollow_copy, sources_by_name

    model = tiny_qwen2(seed=5)
    model.lm_head.weight = model.model.embed_tokens.weight                 # a tied head
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    copy_, originals = hollow_copy(model)
    assert all(p.numel() == 0 and not p.requires_grad for p in copy_.parameters())
    assert copy_.lm_head.weight is copy_.model.embed_tokens.weight          # the tie survives the copy
    assert [p.dtype for p in copy_.parameters()] == [p.dtype for p in model.parameters()]
    for (name, b), (_, a) in zip(model.named_buffers(), copy_.named_buffers()):   # buffers are real copies
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())   # the original is untouched
    sources = sources_by_name(copy_, originals)
    assert [s is p for s, p in zip(sources, unique_parameters(model))] == [True] * len(sources)


def test_an_offloaded_reference_never_copies_a_weight_on_the_policys_device():
    """`train.ref_offload` is there so that a reference that does not fit beside the policy need not: building
    it must not make a second set of weights on the policy's device first (a deep copy would). Every new tensor
    (not a view) an aten op creates while the disk-offloaded reference of a CPU policy is built is recorded."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from grpo.modeling.reference import build_reference

    class Sizes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numels: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, torch.Tensor)}
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:  # views: no
                    self.numels.append(t.numel())
            return out

    policy = tiny_qwen2(vocab_size=4096, seed=6)                             # embedding / head: 131072 values
    largest = max(p.numel() for p in policy.parameters())
    with Sizes() as plain_sizes:
        build_reference(policy, 0.04, offload="none")
    assert max(plain_sizes.numels) == largest                                # the check sees a deep copy's clones
    with Sizes() as sizes:
        ref = build_reference(policy, 0.04, offload="disk")
    assert max(sizes.numels, default=0) < largest
    ids = torch.randint(2, 4096, (2, 6), generator=torch.Generator().manual_seed(0))
    from grpo.modeling.logprobs import fixed_logprobs

    assert torch.equal(ref.logprobs(ids, torch.ones_like(ids), 3, 1.0),
                       fixed_logprobs(policy, ids, torch.ones_like(ids), 3, 1.0))
