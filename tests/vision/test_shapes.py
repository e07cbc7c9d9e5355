import numpy as np
import pytest
import torch

from grpo.vision.shapes import (COLOUR_RGB, COLOURS, POSITIONS, SHAPES, Obj, Scene, all_single_scenes, parse_prompt,
                                prompt_of, render, sample_scene, split_scenes, to_tensor, to_uint8)


def lit(img):
    return img.max(axis=2) > 0


def test_the_world_has_the_named_values():
    assert SHAPES == ("circle", "square", "triangle")
    assert COLOURS == ("red", "green", "blue", "yellow")
    assert POSITIONS == ("top left", "top right", "bottom left", "bottom right")
    rgb = np.array([COLOUR_RGB[c] for c in COLOURS], dtype=float)
    gaps = [np.abs(rgb[i] - rgb[j]).max() for i in range(4) for j in range(i + 1, 4)]
    assert min(gaps) == 255                                    # every pair differs fully in some channel


@pytest.mark.parametrize("size", [16, 32])
def test_render_is_uint8_on_black_and_each_object_stays_in_its_quadrant(size):
    scene = Scene((Obj("circle", "red", "top left"), Obj("triangle", "blue", "bottom right")))
    img = render(scene, size)
    assert img.dtype == np.uint8 and img.shape == (size, size, 3)
    h = size // 2
    assert not lit(img)[:h, h:].any() and not lit(img)[h:, :h].any()      # the two empty quadrants are black
    assert {tuple(p) for p in img[:h, :h][lit(img)[:h, :h]]} == {COLOUR_RGB["red"]}
    assert {tuple(p) for p in img[h:, h:][lit(img)[h:, h:]]} == {COLOUR_RGB["blue"]}
    assert np.array_equal(img, render(scene, size))             # deterministic without rng


def test_a_clean_square_at_16_fills_its_quadrant_minus_a_one_pixel_margin():
    # quadrant 8 px, margin max(1, 8 // 8) = 1 -> rows and columns 1..6 (36 pixels) of the bottom right quadrant
    img = render(Scene((Obj("square", "green", "bottom right"),)), 16)
    expected = np.zeros((16, 16), dtype=bool)
    expected[9:15, 9:15] = True
    assert np.array_equal(lit(img), expected)


def test_a_clean_circle_and_triangle_at_16_have_the_hand_counted_pixels():
    # circle of diameter 6 on the 6 x 6 box: the 4 corner pixels are less than half inside -> 32 pixels
    assert lit(render(Scene((Obj("circle", "red", "top left"),)), 16)).sum() == 32
    # triangle, apex up, 6 px box: rows of width 0, 2, 2, 4, 4, 6 (a pixel is on when half of it is inside)
    tri = lit(render(Scene((Obj("triangle", "red", "top left"),)), 16))
    assert tri[1:7, 1:7].sum(axis=1).tolist() == [0, 2, 2, 4, 4, 6] and tri.sum() == 18


@pytest.mark.parametrize("size", [16, 32])
def test_jitter_moves_and_resizes_objects_but_keeps_them_in_their_quadrant(size):
    rng = np.random.default_rng(0)
    scene = Scene((Obj("square", "yellow", "top right"),))
    imgs = [render(scene, size, rng) for _ in range(30)]
    assert len({img.tobytes() for img in imgs}) > 3
    h = size // 2
    for img in imgs:
        assert lit(img)[:h, h:].sum() >= 0.6 * lit(render(scene, size)).sum()
        assert lit(img).sum() == lit(img)[1:h - 1, h + 1:size - 1].sum()      # inside the quadrant's margin


def test_prompts_read_back_into_their_scene():
    one = Scene((Obj("circle", "red", "top left"),))
    two = Scene((Obj("circle", "red", "top left"), Obj("square", "blue", "bottom right")))
    assert prompt_of(one) == "a red circle at the top left"
    assert prompt_of(two) == "a red circle at the top left and a blue square at the bottom right"
    rng = np.random.default_rng(3)
    scenes = all_single_scenes() + [sample_scene(rng, n) for n in (2, 3) for _ in range(20)]
    assert all(parse_prompt(prompt_of(s)) == s for s in scenes)


@pytest.mark.parametrize("text", ["a purple circle at the top left", "a red circle",
                                  "a red circle at the top left and a blue square at the top left", ""])
def test_parse_prompt_names_the_text_it_cannot_read(text):
    with pytest.raises(ValueError, match="parse_prompt") as err:
        parse_prompt(text)
    assert repr(text) in str(err.value) and "\n" not in str(err.value)


def test_bad_objects_and_scenes_are_refused():
    with pytest.raises(ValueError, match="unknown colour 'purple'"):
        Obj("circle", "purple", "top left")
    with pytest.raises(ValueError, match="share a position"):
        Scene((Obj("circle", "red", "top left"), Obj("square", "red", "top left")))
    with pytest.raises(ValueError, match="4 objects"):
        Scene(tuple(Obj("circle", "red", p) for p in POSITIONS))
    with pytest.raises(ValueError, match="size"):
        render(Scene((Obj("circle", "red", "top left"),)), 15)


def test_scenes_sample_distinct_positions_and_the_single_scenes_split_is_fixed():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3):
        for _ in range(20):
            s = sample_scene(rng, n)
            assert len(s.objects) == n and len({o.position for o in s.objects}) == n
    singles = all_single_scenes()
    assert len(singles) == len(set(singles)) == 48
    train, held = split_scenes(seed=0)
    assert (len(train), len(held)) == (36, 12)
    assert set(train).isdisjoint(held) and set(train) | set(held) == set(singles)
    assert split_scenes(seed=0) == (train, held) and split_scenes(seed=1)[1] != held
    assert len(split_scenes(seed=0, held_out_fraction=0.5)[1]) == 24


def test_tensor_conversion_maps_0_255_to_minus1_1_and_back():
    img = render(Scene((Obj("triangle", "yellow", "bottom left"),)), 16)
    with torch.device("meta"):                                   # the device argument wins over the default
        x = to_tensor(img, torch.device("cpu"))
    assert x.device.type == "cpu" and x.dtype == torch.float32 and x.shape == (3, 16, 16)
    assert x.min().item() == -1.0 and x.max().item() == 1.0
    assert x[0, 0, 0].item() == -1.0                             # black corner
    assert np.array_equal(to_uint8(x), img)
    assert np.array_equal(to_uint8(torch.full((3, 2, 2), 3.0)), np.full((2, 2, 3), 255, dtype=np.uint8))  # clamped
    with pytest.raises(ValueError, match="to_tensor"):
        to_tensor(img.astype(np.float32), "cpu")
