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
