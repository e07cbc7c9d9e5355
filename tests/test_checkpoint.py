import json

import torch

from grpo.checkpoint import list_checkpoints, rng_state, save_checkpoint
from grpo.models import build_model, build_tokenizer, load_policy


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
    assert set(state) == {"optimizer", "scheduler"}
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
