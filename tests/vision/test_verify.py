import numpy as np
import pytest

from grpo.vision.shapes import COLOUR_RGB, Obj, Scene, all_single_scenes, render, sample_scene
from grpo.vision.verify import components, detect, match, nearest_colour, quadrant, shape_of

CHECKS = ("count_ok", "colour_ok", "position_ok", "shape_ok", "binding_ok", "all_ok")


@pytest.mark.parametrize("size", [16, 32])
def test_every_single_scene_is_read_right_on_a_clean_render(size):
    for scene in all_single_scenes():
        obj = scene.objects[0]
        found = detect(render(scene, size))
        assert [(d.colour, d.position, d.shape) for d in found] == [(obj.colour, obj.position, obj.shape)], scene
        result = match(render(scene, size), scene)
        assert all(result[k] for k in CHECKS) and result["score"] == 1.0


@pytest.mark.parametrize("size", [16, 32])
def test_jittered_multi_object_scenes_are_read_right(size):
    rng = np.random.default_rng(7)
    for i in range(150):
        scene = sample_scene(rng, 1 + i % 3)
        assert match(render(scene, size, rng), scene)["all_ok"], scene


def scene(*objs):
    return Scene(tuple(Obj(*o) for o in objs))


def test_broken_images_fail_the_attribute_they_break():
    want = scene(("circle", "red", "top left"))
    blank = np.zeros((16, 16, 3), dtype=np.uint8)
    assert match(blank, want) == {"count_ok": False, "colour_ok": False, "position_ok": False, "shape_ok": False,
                                  "binding_ok": False, "all_ok": False, "score": 0.0, "detections": []}
    recoloured = render(want, 16)
    recoloured[recoloured.max(axis=2) > 0] = COLOUR_RGB["green"]
    r = match(recoloured, want)
    assert (r["colour_ok"], r["position_ok"], r["shape_ok"], r["count_ok"], r["all_ok"]) == (False, True, True, True, False)
    assert r["score"] == 0.75
    moved = render(scene(("circle", "red", "bottom right")), 16)
    r = match(moved, want)
    assert (r["colour_ok"], r["position_ok"], r["shape_ok"], r["count_ok"]) == (True, False, False, True)
    reshaped = render(scene(("square", "red", "top left")), 16)
    r = match(reshaped, want)
    assert (r["colour_ok"], r["position_ok"], r["shape_ok"], r["binding_ok"]) == (True, True, False, False)
    extra = render(scene(("circle", "red", "top left"), ("circle", "blue", "top right")), 16)
    r = match(extra, want)
    assert (r["count_ok"], r["binding_ok"], r["all_ok"]) == (False, True, False)


def test_specks_are_ignored_and_grey_has_no_colour():
    want = scene(("square", "blue", "bottom left"))
    img = render(want, 16)
    img[0, 15] = img[15, 15] = (255, 255, 255)          # two 1-pixel specks (< 1.2% of 256 px)
    assert match(img, want)["all_ok"]
    grey = render(want, 16)
    grey[grey.max(axis=2) > 0] = (128, 128, 128)
    assert [d.colour for d in detect(grey)] == [None]
    assert match(grey, want)["colour_ok"] is False


def test_two_touching_objects_are_one_component():
    img = np.zeros((16, 16, 3), dtype=np.uint8)
    img[2:6, 2:14] = COLOUR_RGB["red"]                   # one bar across both top quadrants
    r = match(img, scene(("square", "red", "top left"), ("square", "red", "top right")))
    assert len(r["detections"]) == 1 and not r["count_ok"]


def test_the_pieces_on_hand_made_inputs():
    mask = np.zeros((5, 5), dtype=bool)
    mask[0, 0] = mask[1, 1] = True                       # diagonal neighbours: one 8-connected component
    mask[4, 4] = mask[4, 2] = True                       # a gap of one pixel: two more
    assert sorted(len(c) for c in components(mask)) == [1, 1, 2]
    assert nearest_colour((250, 20, 10)) == "red" and nearest_colour((200, 220, 30)) == "yellow"
    assert nearest_colour((128, 128, 128)) is None       # 220-221 from every colour (tolerance 110)
    assert shape_of(fill=0.5, top_share=0.25, corners_lit=0) == "triangle"
    assert shape_of(fill=0.78, top_share=0.5, corners_lit=0) == "circle"
    assert shape_of(fill=1.0, top_share=0.5, corners_lit=4) == "square"
    assert quadrant(7.9, 8.1, 16, 16) == "top right" and quadrant(8.0, 0.0, 16, 16) == "bottom left"
    with pytest.raises(ValueError, match="detect"):
        detect(np.zeros((16, 16), dtype=np.uint8))


def test_main_object_is_the_largest_detection_and_counts_the_rest():
    from grpo.vision.verify import main_object

    img = np.zeros((16, 16, 3), dtype=np.uint8)
    assert main_object(img) == (None, 0)
    img[9:15, 9:15] = COLOUR_RGB["blue"]                 # 36 px, bottom right
    img[1:3, 1:3] = COLOUR_RGB["red"]                    # 4 px, top left
    img[0, 15] = COLOUR_RGB["green"]                     # a 1-px speck: not a detection
    main, count = main_object(img)
    assert (main.colour, main.position, main.pixels, count) == ("blue", "bottom right", 36, 2)
