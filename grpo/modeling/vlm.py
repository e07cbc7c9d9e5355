"""A tiny LLaVA-style vision-language model built locally (nothing downloaded), its tokenizer and processor.

The architecture is transformers' ``LlavaForConditionalGeneration``: a CLIP vision tower cuts the image into
patches, a 2-layer MLP projects each patch's feature into the language model's embedding space, and those
vectors replace the ``<image>`` placeholder tokens of the prompt (one per patch) before a Qwen2 decoder runs.
The image therefore enters the model only in the prompt, through ``pixel_values``: the rollout passes them to
the prefill (the decode steps read the image through the KV cache), the log-prob recomputation and the loss
pass them with every forward (``model_inputs``, docs/vlm.md), and no image token is ever a completion token.

The placeholder must never be sampled (a completion holding one would not match the image features in the
next forward): :func:`suppress_image_token` pins its logit to -1e4 with a hook on the LM head, the same in
the rollout and in every recomputation, so its probability is exactly 0 in float32 and the log-probs stay
comparable. :func:`load_vlm` puts the hook back on a saved model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration,
                          PreTrainedTokenizerFast, Qwen2Config)

from grpo.modeling.models import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, TAG_TOKENS, UNK_TOKEN

IMAGE_TOKEN = "<image>"
#: The image token's pinned logit: exp(-1e4 - max) is 0 in float32, and -1e4 * 0 keeps entropies finite.
SUPPRESSED_LOGIT = -1e4
#: Architecture of the tiny VLM (~0.2M parameters): patch 8 on a 32 x 32 image gives 16 image tokens.
VLM_SIZE = dict(vision_hidden=64, vision_layers=2, vision_heads=4, text_hidden=96, text_layers=3, text_heads=4,
                text_kv_heads=2)


def build_vlm_tokenizer(words: list[str], model_max_length: int = 128) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: one token per whitespace-separated word of `words`, the reasoning tags and
    ``<image>`` as single tokens, pad / eos / unk as in grpo.modeling.models. Decoding joins words with spaces."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (*SPECIAL_TOKENS, IMAGE_TOKEN)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN,
                                   unk_token=UNK_TOKEN, padding_side="left", model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False)


def build_image_processor(image_size: int) -> CLIPImageProcessorPil:
    """CLIP's image processor for images already `image_size` square: no resize or crop, only
    x / 255 then (x - 0.5) / 0.5, i.e. pixel values in [-1, 1] (grpo.vision.shapes.to_tensor's scale)."""
    side = {"height": image_size, "width": image_size}
    return CLIPImageProcessorPil(do_resize=False, do_center_crop=False, size=side, crop_size=side,
                                 image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], do_convert_rgb=False)


def build_vlm(tokenizer, image_size: int = 32, patch_size: int = 8, seed: int = 0,
              size: dict | None = None) -> LlavaForConditionalGeneration:
    """A freshly initialised tiny LLaVA (CLIP vision tower + MLP projector + Qwen2 decoder), deterministic
    given `seed`, with the image token suppressed in its output (:func:`suppress_image_token`)."""
    s = {**VLM_SIZE, **(size or {})}
    vision = CLIPVisionConfig(image_size=image_size, patch_size=patch_size, num_channels=3, hidden_size=s["vision_hidden"],
                              intermediate_size=2 * s["vision_hidden"], num_hidden_layers=s["vision_layers"],
                              num_attention_heads=s["vision_heads"])
    text = Qwen2Config(vocab_size=len(tokenizer), hidden_size=s["text_hidden"], intermediate_size=2 * s["text_hidden"],
                       num_hidden_layers=s["text_layers"], num_attention_heads=s["text_heads"],
                       num_key_value_heads=s["text_kv_heads"], max_position_embeddings=tokenizer.model_max_length,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                         image_seq_length=(image_size // patch_size) ** 2, vision_feature_layer=-1,
                         vision_feature_select_strategy="default",      # drop CLS: one token per patch
                         projector_hidden_act="gelu", tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return suppress_image_token(model)


def is_vlm(model) -> bool:
    """True for a model whose prompts carry image placeholder tokens (a config with an image_token_id)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(getattr(inner, "config", None), "image_token_id", None) is not None


def image_token_count(model) -> int:
    """How many ``<image>`` placeholders one image takes in the prompt (patches per image)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return int(inner.config.image_seq_length)


def _pin_image_logit(module, inputs, output):
    index = torch.tensor([module._grpo_image_token], dtype=torch.long, device=output.device)
    return output.index_fill(-1, index, SUPPRESSED_LOGIT)                    # [..., V] image column pinned


def suppress_image_token(model):
    """Pin the image token's logit to SUPPRESSED_LOGIT in every forward (a hook on the output embeddings;
    idempotent). Returns the model."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = inner.get_output_embeddings()
    if not hasattr(head, "_grpo_image_token"):
        head._grpo_image_token = int(inner.config.image_token_id)
        head.register_forward_hook(_pin_image_logit)
    return model


def expand_image_tokens(text: str, count: int) -> str:
    """Each ``<image>`` of a prompt as `count` placeholders (one per image patch), as LlavaProcessor does."""
    return text.replace(IMAGE_TOKEN, IMAGE_TOKEN * count)


def pixel_values(processor, images: list[np.ndarray], device: torch.device | str) -> torch.Tensor:
    """uint8 [H, W, 3] images through the image processor.  Shape: B images -> [B, 3, H, W] float32 on device."""
    values = processor(images=list(images), return_tensors="pt")["pixel_values"]
    return values.to(device=device, dtype=torch.float32)


def vision_rows(rows: list[dict], processor, model, image_column: str = "image") -> list[dict]:
    """Training rows of a VLM: each row's prompt with its ``<image>`` expanded to one placeholder per patch
    and its image (column `image_column`, uint8 [H, W, 3]) as ``pixel_values`` [3, H, W] (the column the
    trainer passes to the model with the prompt, grpo.data.prompts.MODEL_INPUT_COLUMNS). A row without
    its image, or whose prompt has no ``<image>``, is a one-line ValueError naming the row."""
    count, out = image_token_count(model), []
    for i, row in enumerate(rows):
        if row.get(image_column) is None:
            raise ValueError(f"vision_rows: row {i} has no {image_column!r} (prompt {str(row.get('prompt'))[:60]!r})")
        if IMAGE_TOKEN not in str(row.get("prompt", "")):
            raise ValueError(f"vision_rows: row {i}'s prompt has no {IMAGE_TOKEN} placeholder")
        pv = pixel_values(processor, [np.asarray(row[image_column], dtype=np.uint8)], "cpu")[0]   # [3, H, W]
        out.append({**{k: v for k, v in row.items() if k != image_column},
                    "prompt": expand_image_tokens(row["prompt"], count), "pixel_values": pv})
    return out


def save_vlm(model, tokenizer, processor, out: str | Path) -> Path:
    """model + tokenizer + image processor in one Hugging Face directory."""
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def load_vlm(path: str | Path):
    """(model, tokenizer, processor) from a directory written by :func:`save_vlm`; the image token is
    suppressed again (the hook is not saved)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"load_vlm: {path} has no config.json (write one with save_vlm)")
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    processor = CLIPImageProcessorPil.from_pretrained(path)
    return suppress_image_token(model), tokenizer, processor
