import errno
import json
import os
import re
from pathlib import Path

import pytest
import torch

from grpo.state.checkpoint import (CheckpointError, CheckpointWriteError, list_checkpoints, remove_stale_temporaries,
                             restore_rng, rng_state, save_checkpoint, verify_checkpoint)
from grpo.modeling.models import build_model, build_tokenizer, load_policy


def test_checkpoint_is_hf_format_with_trainer_state(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    path = save_checkpoint(tmp_path, 7, model, tok, optimizer=opt, scheduler=sched, state={"epoch": 2},
                           rng=rng_state(torch.Generator().manual_seed(3)))
    assert path == tmp_path / "checkpoint-7"
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "optimizer.pt", "rng_state.pt",
            "trainer_state.json"} <= names
    assert json.loads((path / "trainer_state.json").read_text()) == {"step": 7, "epoch": 2}
    loaded, _ = load_policy(path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), model.parameters()))
    state = torch.load(path / "optimizer.pt", weights_only=False)
    assert set(state) == {"optimizer", "scheduler", "loss_scaler"} and state["loss_scaler"] is None   # fp32: no scaler
    assert not list(tmp_path.glob(".checkpoint-*"))                      # no temporary left behind


def test_save_total_limit_keeps_the_newest(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    for step in (2, 4, 6, 10):
        save_checkpoint(tmp_path, step, model, tok, save_total_limit=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-6", "checkpoint-10"]


def test_a_stale_temporary_is_replaced(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    stale = tmp_path / ".checkpoint-3.tmp"
    stale.mkdir(parents=True)
    (stale / "junk").write_text("half-written")
    path = save_checkpoint(tmp_path, 3, model, tok)
    assert not (path / "junk").exists() and not stale.exists()


def _saved(tmp_path, step=2, **kw):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    return save_checkpoint(tmp_path, step, model, tok, rng=rng_state(), **kw), model, tok


def test_manifest_lists_every_file_with_its_sha256(tmp_path):
    import hashlib

    path, _, _ = _saved(tmp_path, state={"epoch": 1})
    manifest = json.loads((path / "manifest.json").read_text())
    files = {p.name for p in path.iterdir()} - {"manifest.json"}
    assert manifest["step"] == 2 and set(manifest["files"]) == files
    entry = manifest["files"]["trainer_state.json"]
    data = (path / "trainer_state.json").read_bytes()
    assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert verify_checkpoint(path) == manifest


@pytest.mark.parametrize("damage,reason", [
    (lambda p: (p / "manifest.json").unlink(), "checkpoint-2: no manifest.json (incomplete write)"),
    (lambda p: (p / "model.safetensors").unlink(), "checkpoint-2: missing file model.safetensors"),
    (lambda p: (p / "manifest.json").write_text("{not json"), "checkpoint-2: manifest.json is unreadable"),
    (lambda p: (p / "rng_state.pt").write_bytes((p / "rng_state.pt").read_bytes()[:-10]),
     "checkpoint-2: rng_state.pt has"),
    (lambda p: (p / "config.json").write_text((p / "config.json").read_text().replace("32", "33", 1)),
     "checkpoint-2: config.json does not match its sha256 in manifest.json"),
])
def test_verify_names_what_is_wrong(tmp_path, damage, reason):
    path, _, _ = _saved(tmp_path)
    damage(path)
    with pytest.raises(CheckpointError, match=re.escape(reason)):
        verify_checkpoint(path)


def _fail_midway(real_save, errno_code=errno.ENOSPC):
    """torch.save that writes half of the file, then fails like a full disk."""
    def save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        data = Path(f).read_bytes()
        Path(f).write_bytes(data[: len(data) // 2])
        raise OSError(errno_code, os.strerror(errno_code), str(f))
    return save


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    good, model, tok = _saved(tmp_path, step=2)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monkeypatch.setattr(torch, "save", _fail_midway(torch.save))
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(tmp_path, 4, model, tok, optimizer=opt, save_total_limit=1)
    message = str(info.value)
    assert "writing checkpoint" in message and "checkpoint-4 failed: No space left on device" in message
    assert "optimizer.pt" in message and "earlier checkpoints are intact" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]     # no temporary, no checkpoint-4
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    verify_checkpoint(good)


TORCH_ENOSPC = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"   # torch.save on a full disk
SAFETENSORS_ENOSPC = "Error while serializing: I/O error: No space left on device (os error 28)"


def _torch_save_fails_like_a_full_disk(real_save):
    """torch.save that writes part of the file, then raises what torch raises on ENOSPC: a RuntimeError."""
    def save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        Path(f).write_bytes(Path(f).read_bytes()[:100])
        raise RuntimeError(TORCH_ENOSPC)
    return save


def _safetensors_fails_like_a_full_disk(*a, **k):
    from safetensors import SafetensorError

    raise SafetensorError(SAFETENSORS_ENOSPC)


@pytest.mark.parametrize("library", ["torch", "safetensors"])
def test_a_full_disk_reported_as_runtime_error_is_a_one_line_write_error(tmp_path, monkeypatch, library):
    import safetensors.torch

    from grpo.state import checkpoint

    good, model, tok = _saved(tmp_path, step=2)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    if library == "torch":             # torch's message has no errno: the probe write finds the full disk
        monkeypatch.setattr(torch, "save", _torch_save_fails_like_a_full_disk(torch.save))
        monkeypatch.setattr(checkpoint, "probe_write", lambda directory: "No space left on device")
        failed = tmp_path / ".checkpoint-4.tmp" / "optimizer.pt"
    else:                              # safetensors carries "(os error 28)"
        monkeypatch.setattr(safetensors.torch, "save_model", _safetensors_fails_like_a_full_disk)
        failed = tmp_path / ".checkpoint-4.tmp" / "reference.safetensors"
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(tmp_path, 4, model, tok, optimizer=torch.optim.AdamW(model.parameters()), reference=model)
    assert str(info.value) == (f"writing checkpoint {tmp_path / 'checkpoint-4'} failed: No space left on device "
                               f"({failed}); earlier checkpoints are intact")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]     # the temporary is gone
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    verify_checkpoint(good)


def test_a_runtime_error_that_is_not_the_disk_names_itself(tmp_path, monkeypatch):
    _, model, tok = _saved(tmp_path, step=2)

    def save(obj, f, *a, **k):
        raise RuntimeError("cannot pickle this\nsecond line")

    monkeypatch.setattr(torch, "save", save)       # the probe write succeeds: not a full disk
    with pytest.raises(CheckpointWriteError, match=re.escape(
            f"failed: RuntimeError: cannot pickle this ({tmp_path / '.checkpoint-4.tmp' / 'rng_state.pt'}); earlier")):
        save_checkpoint(tmp_path, 4, model, tok, rng=rng_state())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]


def test_write_failure_reason_reads_the_os_error():
    from grpo.state.checkpoint import write_failure_reason

    assert write_failure_reason(OSError(errno.EIO, os.strerror(errno.EIO)), Path("/")) == os.strerror(errno.EIO)
    assert write_failure_reason(RuntimeError(SAFETENSORS_ENOSPC), Path("/")) == os.strerror(errno.ENOSPC)
    assert write_failure_reason(RuntimeError("x"), Path("/no/such/dir")) == "RuntimeError: x"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_checkpoint_file_gets_the_mode_of_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        tok = build_tokenizer()
        model = build_model(tok, "micro", seed=0)
        path = save_checkpoint(tmp_path, 2, model, tok, optimizer=torch.optim.AdamW(model.parameters()),
                               rng=rng_state(), reference=model)
    finally:
        os.umask(previous)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in path.iterdir()}
    assert {"model.safetensors", "reference.safetensors", "optimizer.pt", "manifest.json"} <= set(modes)
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes          # safetensors used to write 0600


def _rewrite_manifest_files(path, keep):
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if keep(k)}
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("edit,reason", [
    (lambda p: _rewrite_manifest_files(p, lambda k: False),
     "checkpoint-2: config.json (and 7 more) is not listed in manifest.json (a partial manifest"),
    (lambda p: _rewrite_manifest_files(p, lambda k: k != "optimizer.pt"),
     "checkpoint-2: optimizer.pt is not listed in manifest.json"),
    (lambda p: ((p / "trainer_state.json").unlink(), _rewrite_manifest_files(p, lambda k: k != "trainer_state.json")),
     "checkpoint-2: manifest.json lists no trainer_state.json"),
    (lambda p: ((p / "model.safetensors").unlink(), _rewrite_manifest_files(p, lambda k: k != "model.safetensors")),
     "checkpoint-2: manifest.json lists no policy weights (model.safetensors or"),
])
def test_a_manifest_must_list_every_file_the_checkpoint_needs(tmp_path, edit, reason):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    path = save_checkpoint(tmp_path, 2, model, tok, optimizer=torch.optim.AdamW(model.parameters()), rng=rng_state(),
                           state={"epoch": 1})
    edit(path)
    with pytest.raises(CheckpointError, match=re.escape(reason)):
        verify_checkpoint(path)


def test_hidden_files_in_a_checkpoint_need_no_manifest_entry(tmp_path):
    path, _, _ = _saved(tmp_path, state={"epoch": 1})
    (path / ".DS_Store").write_bytes(b"finder")
    verify_checkpoint(path)


def test_replacing_a_checkpoint_and_pruning_leave_no_hidden_directories(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    for step in (2, 4, 4, 6):
        save_checkpoint(tmp_path, step, model, tok, save_total_limit=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-6"]
    (tmp_path / ".checkpoint-8.tmp").mkdir()
    (tmp_path / ".checkpoint-6.old").mkdir()
    assert sorted(remove_stale_temporaries(tmp_path)) == [".checkpoint-6.old", ".checkpoint-8.tmp"]
    assert list_checkpoints(tmp_path) == [tmp_path / "checkpoint-4", tmp_path / "checkpoint-6"]


def test_pruning_ignores_checkpoints_newer_than_the_one_written(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, "micro", seed=0)
    for step in (2, 8):
        save_checkpoint(tmp_path, step, model, tok)
    save_checkpoint(tmp_path, 4, model, tok, save_total_limit=1)   # a resumed run re-writing step 4
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-8"]


def test_rng_state_round_trip_restores_every_generator():
    import random

    import numpy as np

    gen = torch.Generator().manual_seed(5)
    state = rng_state(gen, {"order": [1]})
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=gen)))
    restore_rng(state, gen)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=gen))) == expected
