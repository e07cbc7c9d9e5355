"""Visual question answering on the shapes world (grpo/vision/shapes.py): an image of 1-3 shapes and a
question with one verifiable answer, the task of `grpo demo --task shapes-vqa` (VLM-R1 / R1-V style GRPO).

Questions (one generator each, chosen by name in QUESTIONS; a generator returns None when the scene does
not support it, e.g. "what colour is the circle ?" with two circles):

    count        how many shapes are there ?          -> 1 | 2 | 3
    count_colour how many red shapes are there ?      -> 0 | 1 | 2 | 3
    colour_of    what colour is the circle ?          -> red | green | blue | yellow
    where        where is the circle ?                -> top left | ... | bottom right
    shape_at     what shape is at the top left ?      -> circle | square | triangle

A row is ``{"prompt": "<image> <question>", "answer", "image": uint8 [S, S, 3], "scene": prompt_of(scene),
"qtype"}``; a demonstration (:func:`demonstration`) first describes the scene in ``<think>`` and then answers,
so the reasoning is the perception and the answer follows from it. Train and held-out rows are disjoint:
a (scene, question) pair belongs to one split by the SHA-256 of its text (grpo.data.tasks.common.hashed_split).
Rewards: ``exact_match`` (the ``<answer>`` block equals the answer) and ``format``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from grpo.data.tasks.common import hashed_split
from grpo.rewards.text import answer_block, think_answer_parts
from grpo.vision.shapes import COLOURS, POSITIONS, SHAPES, Scene, prompt_of, render, sample_scene

DEFAULT_REWARDS = ("exact_match", "format")
IMAGE_SIZE = 32
HELD_OUT_PERCENT = 20
SPLITS = ("train", "test")


def _count(scene: Scene, rng: np.random.Generator) -> tuple[str, str]:
    return "how many shapes are there ?", str(len(scene.objects))


def _count_colour(scene: Scene, rng: np.random.Generator) -> tuple[str, str]:
    colour = COLOURS[rng.integers(len(COLOURS))]
    return f"how many {colour} shapes are there ?", str(sum(o.colour == colour for o in scene.objects))


def _unique_shape(scene: Scene, rng: np.random.Generator):
    shapes = [o.shape for o in scene.objects]
    unique = [o for o in scene.objects if shapes.count(o.shape) == 1]
    return None if not unique else unique[rng.integers(len(unique))]


def _colour_of(scene: Scene, rng: np.random.Generator) -> tuple[str, str] | None:
    obj = _unique_shape(scene, rng)
    return None if obj is None else (f"what colour is the {obj.shape} ?", obj.colour)


def _where(scene: Scene, rng: np.random.Generator) -> tuple[str, str] | None:
    obj = _unique_shape(scene, rng)
    return None if obj is None else (f"where is the {obj.shape} ?", obj.position)


def _shape_at(scene: Scene, rng: np.random.Generator) -> tuple[str, str]:
    obj = scene.objects[rng.integers(len(scene.objects))]
    return f"what shape is at the {obj.position} ?", obj.shape


#: question type -> generator (scene, rng) -> (question, answer) or None when the scene does not support it.
QUESTIONS: dict[str, Callable] = {"count": _count, "count_colour": _count_colour, "colour_of": _colour_of,
                                  "where": _where, "shape_at": _shape_at}

#: question type -> every answer it can have (the answer space a noisy teacher draws from).
ANSWERS: dict[str, tuple[str, ...]] = {"count": ("1", "2", "3"), "count_colour": ("0", "1", "2", "3"),
                                       "colour_of": COLOURS, "where": POSITIONS, "shape_at": SHAPES}

#: Every word a prompt or a demonstration uses (the VLM's word-level vocabulary, grpo.modeling.vlm).
WORDS = sorted({w for pos in POSITIONS for w in pos.split()} | set(SHAPES) | set(COLOURS) | {"0", "1", "2", "3"}
               | set("how many shapes are there ? what colour is the where shape at and".split()))


def describe(scene: Scene) -> str:
    """The scene as the reasoning of a demonstration: "red circle top left and blue square bottom right"."""
    return " and ".join(f"{o.colour} {o.shape} {o.position}" for o in scene.objects)


def demonstration(row: dict, worked: bool = True) -> str:
    """The SFT target of a row: worked, ``<think> description </think> <answer> answer </answer>``; direct
    (worked=False), ``<think> </think> <answer> answer </answer>``: the answer without describing first."""
    return f"<think> {row['scene_words'] if worked else ''} </think> <answer> {row['answer']} </answer>".replace("  ", " ")


def guess_answer(row: dict, rng: np.random.Generator) -> str:
    """An answer to `row`'s question drawn uniformly from every answer of its type (ANSWERS), right or not:
    what a teacher that answers without looking at the image writes (the noisy teacher of vlm_sft)."""
    answers = ANSWERS[row["qtype"]]
    return answers[rng.integers(len(answers))]


def make_row(scene: Scene, qtype: str, rng: np.random.Generator, size: int = IMAGE_SIZE) -> dict | None:
    """One row for `scene` and question type `qtype`, with a jittered render; None when unsupported."""
    qa = QUESTIONS[qtype](scene, rng)
    if qa is None:
        return None
    question, answer = qa
    return {"prompt": f"<image> {question}", "answer": answer, "image": render(scene, size, rng),
            "scene": prompt_of(scene), "scene_words": describe(scene), "qtype": qtype}


def generate(split: str, n: int, seed: int = 0, size: int = IMAGE_SIZE, max_objects: int = 3,
             qtypes: tuple[str, ...] = tuple(QUESTIONS)) -> list[dict]:
    """`n` rows of `split` ("train" or "test"): random scenes of 1..max_objects shapes, a question type
    drawn uniformly from `qtypes`; a (scene, question) pair is kept when it hashes into `split`."""
    if split not in SPLITS:
        raise ValueError(f"shapes_vqa.generate: split must be 'train' or 'test', got {split!r}")
    unknown = [q for q in qtypes if q not in QUESTIONS]
    if unknown:
        raise ValueError(f"shapes_vqa.generate: unknown question type {unknown[0]!r} (one of {', '.join(QUESTIONS)})")
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    rows = []
    while len(rows) < n:
        scene = sample_scene(rng, int(rng.integers(1, max_objects + 1)))
        row = make_row(scene, qtypes[rng.integers(len(qtypes))], rng, size)
        if row is not None and hashed_split(f"{row['scene']} | {row['prompt']}", HELD_OUT_PERCENT) == split:
            rows.append(row)
    return rows


def described_objects(text: str) -> set[tuple[str, ...]]:
    """The (colour, shape, position) triples a reasoning text names ("red circle top left and ...")."""
    return {tuple(part.split()) for part in text.split(" and ") if len(part.split()) == 4}


def description_reward(prompts: list, completions: list, scene_words: list | None = None, **_: object) -> list:
    """Grounding reward (a verifiable check of the reasoning, GenEval-style): the F1-like overlap
    |named ∩ true| / max(|named|, |true|) between the objects the ``<think>`` block describes and the scene's
    (column ``scene_words``); 0 when the completion is not in the think/answer format, None without the column."""
    if scene_words is None:
        return [None] * len(completions)
    out = []
    for c, truth in zip(completions, scene_words):
        parts = think_answer_parts(c if isinstance(c, str) else str(c))
        named, true = (described_objects(parts[0].strip()) if parts else set()), described_objects(truth)
        out.append(len(named & true) / max(len(named), len(true), 1))
    return out


def accuracy(completions: list[str], rows: list[dict]) -> float:
    """Share of completions whose last ``<answer>`` block equals the row's answer (the held-out metric)."""
    return float(np.mean([answer_block(c) == r["answer"] for c, r in zip(completions, rows)])) if rows else 0.0
