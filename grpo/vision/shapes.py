"""The synthetic shapes world: procedural images of shapes x colours x positions, nothing downloaded.

A scene holds 1 to 3 objects, each in its own quadrant of the image ("a red circle at the top left").
`render` draws it on a black background, `prompt_of`/`parse_prompt` turn it into text and back, and
`grpo.vision.verify` checks an image against a scene with pixel statistics (no learned model). The same
world feeds Flow-GRPO (prompt -> image, grpo/flow/) and vision-language GRPO (image + question -> answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "green", "blue", "yellow")
#: saturated and far apart in RGB (every pair differs by 255 in at least one channel).
COLOUR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}
POSITIONS = ("top left", "top right", "bottom left", "bottom right")
#: quadrant -> (row index, column index) of that quadrant in the 2 x 2 grid.
QUADRANT = {"top left": (0, 0), "top right": (0, 1), "bottom left": (1, 0), "bottom right": (1, 1)}
SUPERSAMPLE = 4          # sub-pixel samples per axis: a pixel is on when at least half its area is inside


@dataclass(frozen=True)
class Obj:
    shape: str
    colour: str
    position: str

    def __post_init__(self):
        for value, allowed, what in ((self.shape, SHAPES, "shape"), (self.colour, COLOURS, "colour"),
                                     (self.position, POSITIONS, "position")):
            if value not in allowed:
                raise ValueError(f"Obj: unknown {what} {value!r} (one of {', '.join(allowed)})")


@dataclass(frozen=True)
class Scene:
    objects: tuple[Obj, ...]

    def __post_init__(self):
        if not 1 <= len(self.objects) <= 3:
            raise ValueError(f"Scene: {len(self.objects)} objects (1 to 3 allowed)")
        positions = [o.position for o in self.objects]
        if len(set(positions)) != len(positions):
            raise ValueError(f"Scene: two objects share a position ({', '.join(positions)})")


def _inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Membership of points in the unit shape. u, v: offsets from the shape's centre in units of its half
    extent (u right, v down), any shape; returns a bool array of the same shape.
    The triangle points up: apex at (0, -1), base from (-1, 1) to (1, 1)."""
    if shape == "circle":
        return u * u + v * v <= 1.0
    if shape == "square":
        return (np.abs(u) <= 1.0) & (np.abs(v) <= 1.0)
    return (v <= 1.0) & (np.abs(u) <= (v + 1.0) / 2.0)           # triangle: half-width grows from 0 to 1


def _box(obj: Obj, size: int, rng: np.random.Generator | None) -> tuple[float, float, float]:
    """(centre x, centre y, half extent) in pixels. The shape stays inside its quadrant minus a margin,
    so shapes in neighbouring quadrants never touch; rng jitters its size (80-100%) and centre. The box's
    edges stay on whole pixels, so a jittered square is still a full rectangle of pixels (with sub-pixel
    edges its corners could drop below half coverage and look like a circle's)."""
    q = size // 2
    margin = max(1, q // 8)
    room = q - 2 * margin                                           # the largest extent that fits
    extent = room if rng is None else max(3, int(round(room * float(rng.uniform(0.8, 1.0)))))
    slack = room - extent
    row, col = QUADRANT[obj.position]
    x0, y0 = col * q + margin + slack // 2, row * q + margin + slack // 2
    if rng is not None:
        x0, y0 = col * q + margin + int(rng.integers(0, slack + 1)), row * q + margin + int(rng.integers(0, slack + 1))
    return x0 + extent / 2, y0 + extent / 2, extent / 2


def render(scene: Scene, size: int = 16, rng: np.random.Generator | None = None) -> np.ndarray:
    """The scene as an image: uint8 [size, size, 3], black background, each object filling most of its
    quadrant. Deterministic when rng is None; rng adds a small jitter of each object's centre and size."""
    if size < 8 or size % 2:
        raise ValueError(f"render: size must be even and at least 8, got {size}")
    img = np.zeros((size, size, 3), dtype=np.uint8)
    s = SUPERSAMPLE
    sub = (np.arange(size * s) + 0.5) / s                           # sub-pixel centres along one axis
    ys, xs = np.meshgrid(sub, sub, indexing="ij")                   # [size*s, size*s]
    for obj in scene.objects:
        cx, cy, half = _box(obj, size, rng)
        hit = _inside(obj.shape, (xs - cx) / half, (ys - cy) / half)
        coverage = hit.reshape(size, s, size, s).mean(axis=(1, 3))  # [size, size] share of each pixel inside
        img[coverage >= 0.5] = COLOUR_RGB[obj.colour]
    return img


def _describe(obj: Obj) -> str:
    return f"a {obj.colour} {obj.shape} at the {obj.position}"


def prompt_of(scene: Scene) -> str:
    """"a red circle at the top left" for one object; "... and a blue square at the bottom right" for more."""
    return " and ".join(_describe(o) for o in scene.objects)


_OBJ_RE = re.compile(rf"a ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)}) at the ({'|'.join(POSITIONS)})")


def parse_prompt(text: str) -> Scene:
    """The inverse of prompt_of; ValueError naming the text when it is not a scene's prompt."""
    parts = text.strip().split(" and ")
    objects = []
    for part in parts:
        m = _OBJ_RE.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"parse_prompt: cannot read {text!r} as 'a <colour> <shape> at the <position>' "
                             f"joined by ' and '")
        objects.append(Obj(shape=m.group(2), colour=m.group(1), position=m.group(3)))
    try:
        return Scene(tuple(objects))
    except ValueError as err:
        raise ValueError(f"parse_prompt: {text!r}: {err}") from None


def sample_scene(rng: np.random.Generator, n_objects: int = 1) -> Scene:
    """A random scene with n_objects (1-3) in distinct quadrants; shapes and colours drawn uniformly."""
    if not 1 <= n_objects <= 3:
        raise ValueError(f"sample_scene: n_objects={n_objects} (1 to 3 allowed)")
    places = rng.permutation(len(POSITIONS))[:n_objects]
    return Scene(tuple(Obj(shape=SHAPES[rng.integers(len(SHAPES))], colour=COLOURS[rng.integers(len(COLOURS))],
                           position=POSITIONS[p]) for p in sorted(places)))


def all_single_scenes() -> list[Scene]:
    """Every one-object scene: 3 shapes x 4 colours x 4 positions = 48, in a fixed order."""
    return [Scene((Obj(s, c, p),)) for s in SHAPES for c in COLOURS for p in POSITIONS]


def split_scenes(seed: int = 0, held_out_fraction: float = 0.25) -> tuple[list[Scene], list[Scene]]:
    """A fixed, seeded split of the 48 single-object scenes into (train, held-out)."""
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"split_scenes: held_out_fraction={held_out_fraction} (must be in (0, 1))")
    scenes = all_single_scenes()
    order = np.random.default_rng(seed).permutation(len(scenes))
    n_held = max(1, round(held_out_fraction * len(scenes)))
    held = sorted(order[:n_held].tolist())
    train = sorted(order[n_held:].tolist())
    return [scenes[i] for i in train], [scenes[i] for i in held]


def to_tensor(img_uint8: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """uint8 [H, W, 3] -> float32 [3, H, W] in [-1, 1] on `device` (0 -> -1, 255 -> 1)."""
    if img_uint8.dtype != np.uint8 or img_uint8.ndim != 3 or img_uint8.shape[2] != 3:
        raise ValueError(f"to_tensor: expected uint8 [H, W, 3], got {img_uint8.dtype} {list(img_uint8.shape)}")
    x = torch.as_tensor(np.ascontiguousarray(img_uint8), device=device).permute(2, 0, 1).to(torch.float32)
    return x / 127.5 - 1.0                                          # [3, H, W]


def to_uint8(tensor: torch.Tensor) -> np.ndarray:
    """float [3, H, W] in [-1, 1] (clamped) -> uint8 [H, W, 3]; the inverse of to_tensor."""
    if tensor.ndim != 3 or tensor.shape[0] != 3:
        raise ValueError(f"to_uint8: expected [3, H, W], got {list(tensor.shape)}")
    x = ((tensor.detach().float().clamp(-1, 1) + 1.0) * 127.5).round()
    return x.permute(1, 2, 0).to("cpu", torch.uint8).numpy()
