import numpy as np
import pytest
import torch

from grpo.data.tasks import shapes_vqa
from grpo.modeling.models import build_model, build_tokenizer
from grpo.modeling.vlm import (IMAGE_TOKEN, build_image_processor, build_vlm, build_vlm_tokenizer, expand_image_tokens,
                               image_token_count, is_vlm, load_vlm, pixel_values, save_vlm, vision_rows)
from grpo.vision.shapes import to_tensor

TINY = dict(vision_hidden=32, vision_layers=1, vision_heads=2, text_hidden=32, text_layers=1, text_heads=2,
            text_kv_heads=1)


def test_the_word_tokenizer_round_trips_prompts_and_demonstrations():
    tok = build_vlm_tokenizer(shapes_vqa.WORDS)
    rows = shapes_vqa.generate("train", 30, seed=0)
    for r in rows:
        for text in (expand_image_tokens(r["prompt"], 3), shapes_vqa.demonstration(r)):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == " ".join(text.replace(IMAGE_TOKEN, f" {IMAGE_TOKEN} ").split())
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    assert tok("<image><image> how", add_special_tokens=False)["input_ids"][:2] == [image_id, image_id]


def test_the_image_processor_matches_the_direct_scaling():
    proc = build_image_processor(32)
    rows = shapes_vqa.generate("train", 3, seed=0)
    got = pixel_values(proc, [r["image"] for r in rows], "cpu")                 # [3, 3, 32, 32]
    want = torch.stack([to_tensor(r["image"], "cpu") for r in rows])           # x / 127.5 - 1
    assert got.shape == (3, 3, 32, 32) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_a_built_vlm_has_one_placeholder_per_patch_and_round_trips_through_save(tmp_path):
    tok = build_vlm_tokenizer(shapes_vqa.WORDS)
    model = build_vlm(tok, image_size=32, patch_size=8, seed=0, size=TINY).eval()
    assert is_vlm(model) and image_token_count(model) == 16                   # (32 / 8) ** 2
    assert not is_vlm(build_model(build_tokenizer(), "micro"))
    proc = build_image_processor(32)
    rows = vision_rows(shapes_vqa.generate("train", 2, seed=0), proc, model)
    assert rows[0]["prompt"].count(IMAGE_TOKEN) == 16 and "image" not in rows[0]
    ids = tok([r["prompt"] for r in rows], add_special_tokens=False, return_tensors="pt", padding=True)
    pixels = torch.stack([r["pixel_values"] for r in rows])
    with torch.no_grad():
        logits = model(**ids, pixel_values=pixels).logits
    save_vlm(model, tok, proc, tmp_path / "vlm")
    loaded, tok2, proc2 = load_vlm(tmp_path / "vlm")
    with torch.no_grad():
        again = loaded.eval()(**ids, pixel_values=pixels).logits
    torch.testing.assert_close(again, logits)
    assert (again[..., tok.convert_tokens_to_ids(IMAGE_TOKEN)] == -1e4).all()   # the suppression is back
    assert tok2.get_vocab() == tok.get_vocab()
    assert np.array_equal(pixel_values(proc2, [np.zeros((32, 32, 3), np.uint8)], "cpu"), -np.ones((1, 3, 32, 32)))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_vlm(tmp_path / "missing")
