"""Checkpoint models (full / LoRA adapter) and `grpo export` to one merged plain model."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from grpo.cli.main import main
from grpo.config import build_config
from grpo.state.export import export_merged
from grpo.state.model_files import checkpoint_kind, load_checkpoint, save_checkpoint_model
from grpo.modeling.lora import apply_lora, is_lora
from grpo.modeling.models import build_tokenizer, load_policy, load_tokenizer

PROMPTS = ["1+2=", "10+20+30=", "7*8="]


def save_base(directory, seed: int = 0):
    """A tiny Llama (2 layers, hidden 32) + the character tokenizer, saved to `directory`."""
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None))
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def train_steps(model, tokenizer, steps: int = 6, lr: float = 2e-2) -> None:
    """A manual loop: AdamW on the LM loss of random strings, so the trainable weights really move."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tokenizer), (4, 16), generator=g)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@torch.no_grad()
def greedy_and_logits(model, tokenizer):
    """Greedy `generate` continuations of left-padded PROMPTS and the prompt logits."""
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    return out[:, batch["input_ids"].size(1):], model(**batch).logits


def assert_same_policy(trained, tokenizer, exported_dir, base_dir):
    exported = AutoModelForCausalLM.from_pretrained(exported_dir).eval()
    assert type(exported) is LlamaForCausalLM and not is_lora(exported)
    ids, logits = greedy_and_logits(trained, tokenizer)
    ids_x, logits_x = greedy_and_logits(exported, load_tokenizer(exported_dir))
    assert torch.equal(ids, ids_x)
    assert torch.allclose(logits, logits_x, atol=1e-5)
    base, _ = load_policy(base_dir)
    assert (greedy_and_logits(base, tokenizer)[1] - logits_x).abs().max() > 1e-2  # training changed the policy


def test_full_fine_tuning_round_trip(tmp_path):
    base_dir = save_base(tmp_path / "base")
    model, tok = load_policy(base_dir)
    train_steps(model, tok)
    ckpt = save_checkpoint_model(model, tok, tmp_path / "ckpt")
    assert checkpoint_kind(ckpt) == "full" and (ckpt / "config.json").is_file()
    out = export_merged(ckpt, tmp_path / "export")
    assert_same_policy(model, tok, out, base_dir)


def test_lora_round_trip_saves_adapter_and_exports_merged(tmp_path):
    base_dir = save_base(tmp_path / "base")
    model, tok = load_policy(base_dir)
    lora = build_config(overrides={"lora.enabled": True, "lora.r": 4, "lora.alpha": 8, "lora.dropout": 0.0}).lora
    model = apply_lora(model, lora)
    train_steps(model, tok)
    ckpt = save_checkpoint_model(model, tok, tmp_path / "ckpt")
    assert checkpoint_kind(ckpt) == "adapter"
    assert not (ckpt / "config.json").exists()  # only the adapter: no second copy of the base weights
    adapter_config = json.loads((ckpt / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(base_dir.resolve())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 8)
    out = export_merged(ckpt, tmp_path / "export")
    assert not (out / "adapter_config.json").exists()
    assert is_lora(model)  # exporting does not touch the live policy
    assert_same_policy(model, tok, out, base_dir)
    merged, merged_tok = load_checkpoint(ckpt)
    assert not is_lora(merged) and merged_tok.padding_side == "left"


def test_lora_on_a_model_built_in_memory_saves_a_merged_full_model(tmp_path):
    base_dir = save_base(tmp_path / "base")
    model, tok = load_policy(base_dir)
    model.name_or_path = ""  # as for a model built from a config: no base directory to point to
    model = apply_lora(model, build_config(overrides={"lora.r": 4, "lora.dropout": 0.0}).lora)
    train_steps(model, tok)
    ckpt = save_checkpoint_model(model, tok, tmp_path / "ckpt")
    assert checkpoint_kind(ckpt) == "full"
    assert is_lora(model) and any("lora_B" in n for n, _ in model.named_parameters())  # live model untouched
    assert_same_policy(model, tok, export_merged(ckpt, tmp_path / "export"), base_dir)


def test_export_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found: .*nope"):
        export_merged(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a model checkpoint"):
        export_merged(tmp_path / "empty", tmp_path / "out")
    base_dir = save_base(tmp_path / "base")
    with pytest.raises(FileExistsError, match="not empty"):
        export_merged(base_dir, base_dir)
    (tmp_path / "ckpt").mkdir()
    gone = {"base_model_name_or_path": str(tmp_path / "gone")}
    (tmp_path / "ckpt" / "adapter_config.json").write_text(json.dumps(gone))
    with pytest.raises(FileNotFoundError, match="base model directory .*gone"):
        export_merged(tmp_path / "ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_export(tmp_path, capsys):
    base_dir = save_base(tmp_path / "base")
    assert main(["export", str(base_dir), str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").dtype == torch.bfloat16
    assert "exported" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint directory not found:") and err.count("\n") == 1


def _training_checkpoint(tmp_path):
    """A full training checkpoint (grpo.state.checkpoint.save_checkpoint) of a trained tiny Llama."""
    from grpo.state.checkpoint import rng_state, save_checkpoint

    base_dir = save_base(tmp_path / "base")
    model, tok = load_policy(base_dir)
    train_steps(model, tok, steps=2)
    return save_checkpoint(tmp_path / "run", 2, model, tok, optimizer=torch.optim.AdamW(model.parameters()),
                           rng=rng_state(), state={"epoch": 1}), model, tok, base_dir


def test_export_verifies_the_manifest_of_a_training_checkpoint(tmp_path, capsys):
    ckpt, model, tok, base_dir = _training_checkpoint(tmp_path)
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01                                   # one flipped bit in the weights
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"error: cannot export {ckpt}: checkpoint-2: model.safetensors does not "
                                       f"match its sha256 in manifest.json\n")
    assert not (tmp_path / "out").exists()
    manifest = json.loads((ckpt / "manifest.json").read_text())    # a manifest that leaves a file out
    del manifest["files"]["model.safetensors"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 2
    assert "checkpoint-2: model.safetensors is not listed in manifest.json" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_an_intact_checkpoint_exports_with_one_file_mode(tmp_path, umask):
    import os

    ckpt, model, tok, base_dir = _training_checkpoint(tmp_path)
    previous = os.umask(umask)
    try:
        out = export_merged(ckpt, tmp_path / "export")
    finally:
        os.umask(previous)
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {oct(0o666 & ~umask)}   # weights too
    assert_same_policy(model, tok, out, base_dir)
