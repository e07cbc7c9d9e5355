"""grpo.cpu.workspace: per-thread CPU buffers by name, grown when needed, freed by release."""

import threading

import torch

from grpo.cpu import workspace


def test_held_reuses_grows_and_releases():
    workspace.release()
    like = torch.zeros(1)
    a = workspace.held("t.a", like, (4, 8))
    assert a.shape == (4, 8) and a.is_contiguous() and a.dtype == torch.float32
    a.fill_(3.0)
    b = workspace.held("t.a", like, (2, 8))                                 # fewer rows: the same memory
    assert b.data_ptr() == a.data_ptr() and (b == 3.0).all()
    c = workspace.held("t.a", like, (8, 8))                                 # more: a larger buffer
    assert c.shape == (8, 8) and workspace.held("t.a", like, (8, 8)).data_ptr() == c.data_ptr()
    d = workspace.held("t.a", like, (4, 8), torch.float64)                  # another dtype: its own buffer
    assert d.dtype == torch.float64 and d.data_ptr() != c.data_ptr()
    assert workspace.held("t.b", like, (4, 8)).data_ptr() not in (c.data_ptr(), d.data_ptr())
    assert workspace.held_names() == {"t.a", "t.b"}
    workspace.release()
    assert not workspace.held_names()


def test_other_devices_and_threads_get_their_own_tensors():
    workspace.release()
    meta = workspace.held("t.m", torch.zeros(1, device="meta"), (3, 2))
    assert meta.device.type == "meta" and not workspace.held_names()       # not kept off the CPU
    here = workspace.held("t.x", torch.zeros(1), (3, 2)).data_ptr()
    other = []
    thread = threading.Thread(target=lambda: other.append(workspace.held("t.x", torch.zeros(1), (3, 2)).data_ptr()))
    thread.start()
    thread.join()
    assert other[0] != here
    workspace.release()
