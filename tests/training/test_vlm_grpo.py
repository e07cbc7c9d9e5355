"""The image path end to end on a tiny LLaVA (grpo.modeling.vlm): GRPO through grpo.Trainer with pixel values
passed with every prompt, log-probs that match the rollout's, no loss on image tokens, clear errors."""

from __future__ import annotations

import contextlib

import pytest
import torch

import grpo
from grpo.data.datasets_io import DataError
from grpo.data.prompts import tokenize_prompts
from grpo.data.tasks import shapes_vqa
from grpo.modeling.logprobs import fixed_logprobs
from grpo.modeling.vlm import IMAGE_TOKEN, build_image_processor, build_vlm, build_vlm_tokenizer, vision_rows
from grpo.rollout import sample
from grpo.rollout.params import Prompts, SamplingParams

TINY = dict(vision_hidden=32, vision_layers=1, vision_heads=2, text_hidden=32, text_layers=1, text_heads=2,
            text_kv_heads=1)


def tiny_vlm(seed: int = 0):
    tok = build_vlm_tokenizer(shapes_vqa.WORDS)
    return build_vlm(tok, image_size=32, patch_size=8, seed=seed, size=TINY), tok, build_image_processor(32)


def rows_for(model, processor, n: int = 4):
    return vision_rows(shapes_vqa.generate("train", n, seed=0), processor, model)


def length_reward(completions, **kwargs):
    return [float(len(c.split())) for c in completions]


def grpo_config(out, **over):
    return {"max_steps": 2, "num_generations": 4, "learning_rate": 1e-2, "max_completion_length": 6,
            "train.prompts_per_step": 2, "log.progress_bar": False, "cpu.num_threads": 1,
            "train.output_dir": str(out), "rollout.temperature": 1.0, **over}


@contextlib.contextmanager
def meta_default_device():
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("on_meta", [False, True])
def test_two_grpo_steps_on_images_change_the_vision_tower_and_the_decoder(tmp_path, on_meta):
    model, tok, proc = tiny_vlm()
    rows = rows_for(model, proc, 8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = grpo.Trainer(model, reward_funcs=[length_reward], train_dataset=rows, tokenizer=tok,
                           config=grpo_config(tmp_path, **({"algorithm.beta": 0.04} if on_meta else {})))
    with meta_default_device() if on_meta else contextlib.nullcontext():   # every tensor on an explicit device
        result = trainer.train()
    assert result.steps == 2
    moved = {n for n, p in result.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert any(n.startswith("model.vision_tower.") for n in moved)      # the gradient reached the image encoder
    assert any(n.startswith("model.multi_modal_projector.") for n in moved)
    assert any(n.startswith("model.language_model.") for n in moved)


def test_rollout_logprobs_equal_a_recomputation_with_the_pixel_values():
    model, tok, proc = tiny_vlm(seed=1)
    rows = rows_for(model, proc, 3)
    batch = tokenize_prompts(tok, rows, "cpu")
    assert batch.model_inputs["pixel_values"].shape == (3, 3, 32, 32)
    gen = sample(model, Prompts(batch.prompt_ids, batch.prompt_mask, model_inputs=batch.model_inputs),
                 SamplingParams(n=4, max_tokens=8, temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=5),
                 pad_token_id=tok.pad_token_id)
    assert gen.model_inputs["pixel_values"].shape == (12, 3, 32, 32)
    assert torch.equal(gen.model_inputs["pixel_values"][4], batch.model_inputs["pixel_values"][1])  # row i*G+g
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
    mask = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
    T, on = gen.completion_ids.shape[1], gen.completion_mask.bool()
    for mb in (0, 5):                                                   # whatever the micro-batching
        again = fixed_logprobs(model, ids, mask, T, 1.0, micro_batch_size=mb, model_inputs=gen.model_inputs)
        torch.testing.assert_close(again[on], gen.sampling_logprobs[on], atol=2e-5, rtol=0)
    blind = fixed_logprobs(model, ids, mask, T, 1.0)                    # the same tokens without the images
    assert (blind[on] - gen.sampling_logprobs[on]).abs().max() > 1e-3


def test_image_tokens_are_prompt_only_never_sampled_and_carry_no_loss():
    model, tok, proc = tiny_vlm(seed=2)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    rows = rows_for(model, proc, 4)
    batch = tokenize_prompts(tok, rows, "cpu")
    assert ((batch.prompt_ids == image_id).sum(1) == 16).all()          # 32 / 8 = 4 x 4 patches per image
    with torch.no_grad():                                                # the untrained head would favour it:
        model.get_output_embeddings().weight[image_id] *= 50.0         # suppression must still win
    gen = sample(model, Prompts(batch.prompt_ids, batch.prompt_mask, model_inputs=batch.model_inputs),
                 SamplingParams(n=8, max_tokens=12, temperature=1.5, stop_token_ids=(tok.eos_token_id,)),
                 pad_token_id=tok.pad_token_id)
    assert not (gen.completion_ids == image_id).any()
    logits = model(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask, **batch.model_inputs).logits
    assert (logits[..., image_id] == -1e4).all()                        # probability exactly 0 in float32
    assert torch.log_softmax(logits[:, -1], -1)[:, image_id].exp().max() == 0.0
    # the SFT loss: every prompt position (the image placeholders included) is ignored
    from grpo.training.sft import IGNORE_INDEX, build_batch

    sft = build_batch(tok, [r["prompt"] for r in rows], [shapes_vqa.demonstration(r) for r in rows])
    image_positions = sft["input_ids"] == image_id
    assert image_positions.sum() == 4 * 16 and (sft["labels"][image_positions] == IGNORE_INDEX).all()


def test_a_row_without_its_image_is_a_one_line_error(tmp_path):
    model, tok, proc = tiny_vlm()
    raw = shapes_vqa.generate("train", 3, seed=0)
    raw[1] = {k: v for k, v in raw[1].items() if k != "image"}
    with pytest.raises(ValueError, match=r"vision_rows: row 1 has no 'image'") as err:
        vision_rows(raw, proc, model)
    assert "\n" not in str(err.value)
    rows = rows_for(model, proc, 3)
    rows[2] = {k: v for k, v in rows[2].items() if k != "pixel_values"}
    with pytest.raises(DataError, match=r"prompt row 2 has no 'pixel_values'") as err:
        tokenize_prompts(tok, rows, "cpu")
    assert "\n" not in str(err.value)
    blind = [{k: v for k, v in r.items() if k != "pixel_values"} for r in rows]
    trainer = grpo.Trainer(model, reward_funcs=[length_reward], train_dataset=blind, tokenizer=tok,
                           config=grpo_config(tmp_path))
    with pytest.raises(ValueError, match=r"row 0 has no 'pixel_values'") as err:
        trainer.train()
    assert "\n" not in str(err.value)
