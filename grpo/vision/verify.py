"""A verifier for the shapes world written by the project: pixel statistics and connected components,
no learned model (GenEval's object / colour / position checks, on our procedural images).

`detect` finds the objects of an image: the lit pixels (brightest channel >= `on_level`) are grouped into
8-connected components; each component large enough gets a colour (the nearest of COLOURS to its mean RGB,
None when nothing is near), a position (the quadrant of its centroid) and a shape guess from its bounding
box: the share of its pixels in the top half of the box (a triangle pointing up holds about 1/4 there, a
circle or a square 1/2), then the fill ratio pixels / box area (square ~1, circle ~pi/4 = 0.785, triangle ~0.5)
and whether the box's corners are lit. `match` compares the detections with a scene.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from grpo.vision.shapes import COLOUR_RGB, COLOURS, POSITIONS, Scene

ON_LEVEL = 96            # a pixel is lit when its brightest channel reaches this (black background is 0)
COLOUR_TOLERANCE = 110.0  # a mean RGB farther than this from every COLOURS entry has colour None
MIN_AREA = 0.012         # components smaller than this share of the image are noise (3 px at 16x16)
TRIANGLE_TOP_SHARE = 0.40  # a component with less of its mass in the top half of its box is a triangle
SQUARE_FILL = 0.93       # fill ratio at or above which a (non-triangle) component is a square


@dataclass(frozen=True)
class Detection:
    colour: str | None   # nearest of COLOURS to the component's mean RGB, None when none is within tolerance
    position: str        # quadrant of the centroid (one of POSITIONS)
    shape: str           # "circle" | "square" | "triangle", the guess from the box statistics
    area: float          # pixels / image area
    pixels: int          # the component's pixel count
    fill: float          # pixels / bounding-box area
    top_share: float     # share of the pixels in the top half of the bounding box


def components(mask: np.ndarray) -> list[np.ndarray]:
    """8-connected components of a bool mask [H, W]: one int array [n, 2] of (row, col) per component,
    in raster order of their first pixel."""
    h, w = mask.shape
    seen = np.zeros_like(mask, dtype=bool)
    found = []
    for r0, c0 in zip(*np.nonzero(mask)):
        if seen[r0, c0]:
            continue
        seen[r0, c0] = True
        queue, members = deque([(r0, c0)]), []
        while queue:
            r, c = queue.popleft()
            members.append((r, c))
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    rr, cc = r + dr, c + dc
                    if 0 <= rr < h and 0 <= cc < w and mask[rr, cc] and not seen[rr, cc]:
                        seen[rr, cc] = True
                        queue.append((rr, cc))
        found.append(np.asarray(members, dtype=np.int64))
    return found


def nearest_colour(rgb: np.ndarray, tolerance: float = COLOUR_TOLERANCE) -> str | None:
    """The COLOURS entry nearest to an RGB triple (Euclidean), or None when it is farther than tolerance."""
    table = np.asarray([COLOUR_RGB[c] for c in COLOURS], dtype=np.float64)    # [4, 3]
    dist = np.linalg.norm(table - np.asarray(rgb, dtype=np.float64), axis=1)  # [4]
    best = int(dist.argmin())
    return COLOURS[best] if dist[best] <= tolerance else None


def shape_of(fill: float, top_share: float, corners_lit: int) -> str:
    """The shape guess from a component's box statistics (see the module docstring)."""
    if top_share < TRIANGLE_TOP_SHARE:
        return "triangle"
    return "square" if fill >= SQUARE_FILL or corners_lit >= 3 else "circle"


def quadrant(row: float, col: float, height: int, width: int) -> str:
    """The quadrant (one of POSITIONS) holding the point (row, col) of an image of that size."""
    return POSITIONS[2 * int(row >= height / 2) + int(col >= width / 2)]


def detect(img: np.ndarray, min_area: float = MIN_AREA) -> list[Detection]:
    """The objects of a uint8 [H, W, 3] image, one Detection per lit component of at least min_area."""
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"detect: expected a uint8 [H, W, 3] image, got {img.dtype} {list(img.shape)}")
    h, w, _ = img.shape
    lit = img.max(axis=2) >= ON_LEVEL                                   # [H, W]
    found = []
    for members in components(lit):
        n = len(members)
        if n < min_area * h * w:
            continue
        rows, cols = members[:, 0], members[:, 1]
        r0, r1, c0, c1 = rows.min(), rows.max(), cols.min(), cols.max()
        box_h, box_w = r1 - r0 + 1, c1 - c0 + 1
        fill = n / float(box_h * box_w)
        rel = rows - r0                                                 # row within the box; the middle row counts half
        top_share = float((rel < (box_h - 1) / 2).sum() + 0.5 * (rel == (box_h - 1) / 2).sum()) / n
        corners_lit = int(sum(lit[r, c] for r in (r0, r1) for c in (c0, c1)))
        mean_rgb = img[rows, cols].astype(np.float64).mean(axis=0)      # [3]
        found.append(Detection(colour=nearest_colour(mean_rgb),
                               position=quadrant(rows.mean() + 0.5, cols.mean() + 0.5, h, w),
                               shape=shape_of(fill, top_share, corners_lit), area=n / float(h * w), pixels=n,
                               fill=fill, top_share=top_share))
    return found


def match(img: np.ndarray, scene: Scene, min_area: float = MIN_AREA) -> dict:
    """How an image agrees with a scene; booleans per attribute, each over all of the scene's objects:
      count_ok     as many detections as objects;
      colour_ok    every object's colour is among the detections' colours (as a multiset);
      position_ok  every object's quadrant holds a detection;
      shape_ok     every object's quadrant holds a detection of its shape;
      binding_ok   every object's quadrant holds a detection of its colour and its shape;
      all_ok       count_ok and binding_ok (the image shows exactly the scene).
    Also `detections` (the list) and `score`, the mean of the first four booleans (a graded reward)."""
    found = detect(img, min_area)
    colours = [d.colour for d in found]
    colour_ok = True
    for obj in scene.objects:                                        # multiset inclusion
        if obj.colour in colours:
            colours.remove(obj.colour)
        else:
            colour_ok = False
    at = {p: [d for d in found if d.position == p] for p in POSITIONS}
    position_ok = all(at[o.position] for o in scene.objects)
    shape_ok = all(any(d.shape == o.shape for d in at[o.position]) for o in scene.objects)
    binding_ok = all(any(d.shape == o.shape and d.colour == o.colour for d in at[o.position]) for o in scene.objects)
    count_ok = len(found) == len(scene.objects)
    return {"count_ok": count_ok, "colour_ok": colour_ok, "position_ok": position_ok, "shape_ok": shape_ok,
            "binding_ok": binding_ok, "all_ok": count_ok and binding_ok,
            "score": (count_ok + colour_ok + position_ok + shape_ok) / 4.0, "detections": found}


def main_object(img: np.ndarray, min_area: float = MIN_AREA) -> tuple[Detection | None, int]:
    """The largest detection of an image (None when nothing is detected) and the number of detections:
    a check made on the main object alone is not passed by scattering extra blobs."""
    found = detect(img, min_area)
    return (max(found, key=lambda d: d.pixels) if found else None), len(found)
