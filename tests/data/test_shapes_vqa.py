import numpy as np
import pytest

from grpo.data.tasks import shapes_vqa
from grpo.data.tasks.shapes_vqa import QUESTIONS, demonstration, describe, generate
from grpo.rewards.builtin import exact_match, format_reward
from grpo.vision.shapes import Obj, Scene, parse_prompt
from grpo.vision.verify import match


class Pick:
    """An rng stand-in whose integers(n) returns a fixed choice."""

    def __init__(self, k: int):
        self.k = k

    def integers(self, n):
        return self.k % n


SCENE = Scene((Obj("circle", "red", "top left"), Obj("circle", "blue", "top right"),
               Obj("square", "red", "bottom left")))


def test_each_question_type_answers_a_hand_made_scene():
    assert QUESTIONS["count"](SCENE, Pick(0)) == ("how many shapes are there ?", "3")
    assert QUESTIONS["count_colour"](SCENE, Pick(0)) == ("how many red shapes are there ?", "2")
    assert QUESTIONS["count_colour"](SCENE, Pick(1)) == ("how many green shapes are there ?", "0")
    # two circles: only the square is unique, so it is the one asked about
    assert QUESTIONS["colour_of"](SCENE, Pick(0)) == ("what colour is the square ?", "red")
    assert QUESTIONS["where"](SCENE, Pick(0)) == ("where is the square ?", "bottom left")
    assert QUESTIONS["shape_at"](SCENE, Pick(1)) == ("what shape is at the top right ?", "circle")
    twins = Scene((Obj("circle", "red", "top left"), Obj("circle", "blue", "top right")))
    assert QUESTIONS["colour_of"](twins, Pick(0)) is None and QUESTIONS["where"](twins, Pick(0)) is None
    assert describe(SCENE) == "red circle top left and blue circle top right and red square bottom left"


def test_rows_are_consistent_with_their_image_and_the_splits_are_disjoint():
    train, test = generate("train", 120, seed=0), generate("test", 60, seed=0)
    assert len(train) == 120 and len(test) == 60
    key = lambda r: (r["scene"], r["prompt"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    for r in train[:40] + test[:20]:
        scene = parse_prompt(r["scene"])
        assert r["image"].shape == (32, 32, 3) and match(r["image"], scene)["all_ok"]   # the image shows the scene
        assert r["prompt"].startswith("<image> ") and r["qtype"] in QUESTIONS
    assert {r["qtype"] for r in train} == set(QUESTIONS)
    again = generate("train", 120, seed=0)
    assert [key(r) for r in again] == [key(r) for r in train]
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(again, train))
    assert [key(r) for r in generate("train", 120, seed=1)] != [key(r) for r in train]


def test_a_demonstration_earns_both_rewards_and_uses_only_task_words():
    rows = generate("train", 50, seed=3)
    demos = [demonstration(r) for r in rows]
    assert demos[0] == f"<think> {rows[0]['scene_words']} </think> <answer> {rows[0]['answer']} </answer>"
    assert exact_match(None, demos, answer=[r["answer"] for r in rows]) == [1.0] * 50
    assert format_reward(None, demos) == [1.0] * 50
    tags = {"<image>", "<think>", "</think>", "<answer>", "</answer>"}
    words = {w for r, d in zip(rows, demos) for w in (r["prompt"] + " " + d).split()} - tags
    assert words <= set(shapes_vqa.WORDS)
    wrong = [d.replace(f"<answer> {r['answer']} </answer>", "<answer> nothing </answer>") for r, d in zip(rows, demos)]
    assert shapes_vqa.accuracy(wrong, rows) == 0.0 and shapes_vqa.accuracy(demos, rows) == 1.0


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'dev'"):
        generate("dev", 3)
    with pytest.raises(ValueError, match="unknown question type 'size'"):
        generate("train", 3, qtypes=("size",))


def test_the_description_reward_scores_the_objects_the_reasoning_names():
    truth = "red circle top left and blue square bottom right"
    done = lambda think: f"<think> {think} </think> <answer> 1 </answer>"  # noqa: E731
    got = shapes_vqa.description_reward(None, [done("red circle top left"), done(truth),
                                               done(truth + " and green triangle top right"),
                                               done("red square top left"), "red circle top left"],
                                        scene_words=[truth] * 5)
    assert got == [0.5, 1.0, 2 / 3, 0.0, 0.0]           # |named & true| / max(|named|, |true|); no format -> 0
    assert shapes_vqa.description_reward(None, [done(truth)]) == [None]


def test_a_guess_is_drawn_from_every_answer_of_the_question_type():
    row = {"qtype": "count_colour", "answer": "2"}
    assert [shapes_vqa.guess_answer(row, Pick(k)) for k in range(4)] == ["0", "1", "2", "3"]
    assert set(shapes_vqa.ANSWERS) == set(QUESTIONS)
    for q, answers in shapes_vqa.ANSWERS.items():          # every generated answer is in its type's answer space
        assert all(r["answer"] in answers for r in generate("train", 40, seed=3, qtypes=(q,)))
