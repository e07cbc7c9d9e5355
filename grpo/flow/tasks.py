"""Prompt worlds for Flow-GRPO (`flow.task`) and their rule-based rewards (`flow.reward`).

A task gives the prompts (train and held-out), each as text with its label tensor, the data shape, a
new model for it, reward functions (`flow.reward` picks the training one) and evaluation metrics.

* ``shapes``: one object of 3 shapes x 4 colours x 4 positions in a 16 x 16 RGB image
  (grpo/vision/shapes.py); labels (shape, colour, position). The checks come from grpo/vision/verify.py,
  GenEval-like (colour / position / shape / count):
    - reward ``geneval``: the mean of count_ok, colour_ok, position_ok, shape_ok (graded);
    - reward and metric ``compositional`` (the demo's measure): colour_ok and position_ok of `match` (*some*
      detection has the colour, *some* the quadrant: gamed by extra blobs); reward and metric
      ``compositional_main``: the image's main object (its largest detection,
      `grpo.vision.verify.main_object`) has the asked colour and sits in the asked quadrant, so a blob in
      every quadrant does not pass it;
    - reward ``single``: ``compositional_main`` divided by the number of detections (1 for one clean object,
      1/2 with one extra blob, ...), a count term so extra blobs cost reward;
    - metric ``gold``: exactly one object, of the right colour, in the right place (count_ok, colour_ok and
      position_ok), never a training reward, so a reward that can be gamed (extra blobs, painted
      backgrounds) shows as gold falling; metric ``exact``: all_ok, the scene with its shape too (strict:
      the shape guess of 16 x 16 samples is rarely right);
    - reward ``colour_proxy``: the share of the image's pixels near the prompt's colour, a proxy that
      is hacked by painting everything in that colour (the beta test's reward).
* ``mixture``: the 2-D Gaussian mixture of grpo/flow/mixture.py, a label asks for a component; reward
  1 when the point's nearest component is the asked one (the test bed of the loop), and the hackable
  proxy ``rightward`` (the x coordinate, whatever was asked) whose optimum leaves the asked component.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from grpo.flow.mixture import default_mixture, nearest_component
from grpo.flow.models import FlowModel, MLPFlow, TinyDiT
from grpo.vision.shapes import COLOUR_RGB, COLOURS, POSITIONS, SHAPES, Scene, prompt_of, split_scenes, to_uint8
from grpo.vision.verify import main_object, match


@dataclass(frozen=True)
class Prompt:
    text: str
    labels: tuple[int, ...]      # one class index per label field
    scene: Scene | None = None


Metric = Callable[[torch.Tensor, list], torch.Tensor]     # (samples [N, ...], prompts [N]) -> [N] float32


@dataclass(frozen=True)
class FlowTask:
    vocab: list[int]                                      # classes per label field
    data_shape: Callable[[object], tuple[int, ...]]       # FlowConfig -> shape of one sample
    prompts: Callable[[int, float], tuple[list[Prompt], list[Prompt]]]   # (seed, held_out_fraction) -> (train, held-out)
    new_model: Callable[[object], FlowModel]              # FlowConfig -> a model with random weights
    rewards: dict[str, Metric]                            # flow.reward choices
    metrics: dict[str, Metric]                            # evaluation metrics (gold among them)


def run_prompts(task: FlowTask, fc) -> tuple[list[Prompt], list[Prompt]]:
    """(Flow-GRPO's training prompts, its evaluation prompts) under the `flow` config section `fc`. The task's
    split (`flow.split_seed`, `flow.held_out_fraction`) gives (seen, held out): the
    base model was pre-trained on the seen prompts only. A share `train_unseen_fraction` of the held-out
    prompts (`flow.train_unseen_fraction`, picked by a permutation keyed by the seed) becomes Flow-GRPO training prompts, unseen in
    pre-training but now scored by the reward; the evaluation keeps the rest, unseen by both stages.
    `flow.train_on_seen`: Flow-GRPO also trains on the seen prompts. The defaults keep the task's split."""
    from grpo.config.schema import ConfigError

    seed, train_unseen_fraction, train_on_seen = fc.split_seed, fc.train_unseen_fraction, fc.train_on_seen
    seen, held = task.prompts(seed, fc.held_out_fraction)
    k = round(train_unseen_fraction * len(held))
    if k >= len(held):
        raise ConfigError(f"flow.train_unseen_fraction={train_unseen_fraction} leaves no held-out prompt to evaluate "
                          f"on ({len(held)} held out)")
    if k == 0 and not train_on_seen:
        raise ConfigError("flow.train_on_seen=false needs flow.train_unseen_fraction > 0 (no training prompts left)")
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    order = torch.randperm(len(held), generator=g, device="cpu").tolist() if k else []
    moved = set(order[:k])
    return ((seen if train_on_seen else []) + [held[i] for i in order[:k]],
            [p for i, p in enumerate(held) if i not in moved])


def labels_tensor(prompts: list[Prompt], device: torch.device) -> torch.Tensor:
    """The label rows of prompts.   -> [N, K] long on `device`"""
    return torch.tensor([p.labels for p in prompts], dtype=torch.long, device=device)

# ---------------------------------------------------------------- shapes


def scene_labels(scene: Scene) -> tuple[int, int, int]:
    o = scene.objects[0]
    return SHAPES.index(o.shape), COLOURS.index(o.colour), POSITIONS.index(o.position)


def shape_prompts(seed: int, held_out_fraction: float) -> tuple[list[Prompt], list[Prompt]]:
    train, held = split_scenes(seed, held_out_fraction)
    return ([Prompt(prompt_of(s), scene_labels(s), s) for s in train],
            [Prompt(prompt_of(s), scene_labels(s), s) for s in held])


def _checks(images: torch.Tensor, prompts: list[Prompt]) -> list[dict]:
    return [match(to_uint8(img), p.scene) for img, p in zip(images, prompts)]


def _from_checks(key: Callable[[dict], float]) -> Metric:
    def metric(images: torch.Tensor, prompts: list[Prompt]) -> torch.Tensor:
        return torch.tensor([float(key(c)) for c in _checks(images, prompts)], dtype=torch.float32,
                            device=images.device)
    return metric


def _main_checks(images: torch.Tensor, prompts: list[Prompt]) -> list[tuple[bool, int]]:
    """(the main object has the asked colour and quadrant, number of detections) per image."""
    out = []
    for img, p in zip(images, prompts):
        main, count = main_object(to_uint8(img))
        obj = p.scene.objects[0]
        out.append((main is not None and main.colour == obj.colour and main.position == obj.position, count))
    return out


def main_compositional(images: torch.Tensor, prompts: list[Prompt]) -> torch.Tensor:
    """1 when the largest detection has the asked colour and quadrant.   [N, 3, H, W] -> [N]"""
    return torch.tensor([float(ok) for ok, _ in _main_checks(images, prompts)], dtype=torch.float32,
                        device=images.device)


def single(images: torch.Tensor, prompts: list[Prompt]) -> torch.Tensor:
    """main_compositional / number of detections: extra blobs cost reward.   [N, 3, H, W] -> [N]"""
    return torch.tensor([float(ok) / max(count, 1) for ok, count in _main_checks(images, prompts)],
                        dtype=torch.float32, device=images.device)


def colour_proxy(images: torch.Tensor, prompts: list[Prompt]) -> torch.Tensor:
    """Share of pixels within 0.5 (in [-1, 1] units, per channel) of the prompt's colour.   [N, 3, H, W] -> [N]"""
    rgb = torch.tensor([COLOUR_RGB[p.scene.objects[0].colour] for p in prompts], dtype=torch.float32,
                       device=images.device) / 127.5 - 1                          # [N, 3]
    near = ((images.float().clamp(-1, 1) - rgb[:, :, None, None]).abs() <= 0.5).all(dim=1)   # [N, H, W]
    return near.float().flatten(1).mean(dim=1)


def placement(images: torch.Tensor, prompts: list[Prompt], on_level: float = 96 / 127.5 - 1,
              min_pixels: int = 8) -> torch.Tensor:
    """Share of the lit pixels that are in the asked quadrant and nearest to the asked colour, times
    min(1, those pixels / min_pixels): dense, and extra blobs anywhere else lower it.   [N, 3, H, W] -> [N]"""
    x = images.float().clamp(-1, 1)
    n, _, h, w = x.shape
    lit = x.amax(dim=1) >= on_level                                              # [N, H, W]
    table = torch.tensor([COLOUR_RGB[c] for c in COLOURS], dtype=torch.float32, device=x.device) / 127.5 - 1
    nearest = torch.cdist(x.permute(0, 2, 3, 1).reshape(n, -1, 3), table[None].expand(n, -1, -1)).argmin(-1)
    asked_colour = torch.tensor([COLOURS.index(p.scene.objects[0].colour) for p in prompts], device=x.device)
    rows = torch.arange(h, device=x.device)[:, None] >= h // 2                   # [H, 1] bottom half
    cols = torch.arange(w, device=x.device)[None, :] >= w // 2                   # [1, W] right half
    quadrant = torch.stack([(rows == (p.scene.objects[0].position.startswith("bottom")))
                            & (cols == p.scene.objects[0].position.endswith("right")) for p in prompts])   # [N, H, W]
    good = lit & quadrant & (nearest.view(n, h, w) == asked_colour[:, None, None])
    share = good.flatten(1).sum(1) / lit.flatten(1).sum(1).clamp(min=1)
    return share * (good.flatten(1).sum(1).float() / min_pixels).clamp(max=1)


SHAPES_TASK = FlowTask(
    vocab=[len(SHAPES), len(COLOURS), len(POSITIONS)],
    data_shape=lambda fc: (3, fc.image_size, fc.image_size),
    prompts=shape_prompts,
    new_model=lambda fc: TinyDiT([len(SHAPES), len(COLOURS), len(POSITIONS)], image_size=fc.image_size,
                                 patch=fc.model_patch, dim=fc.model_dim, depth=fc.model_depth),
    rewards={"geneval": _from_checks(lambda c: c["score"]), "compositional_main": main_compositional, "single": single,
             "compositional": _from_checks(lambda c: c["colour_ok"] and c["position_ok"]),
             "placement": placement, "colour_proxy": colour_proxy},
    metrics={"geneval": _from_checks(lambda c: c["score"]), "compositional_main": main_compositional,
             "compositional": _from_checks(lambda c: c["colour_ok"] and c["position_ok"]),
             "gold": _from_checks(lambda c: c["count_ok"] and c["colour_ok"] and c["position_ok"]),
             "exact": _from_checks(lambda c: c["all_ok"]), "placement": placement,
             "colour_proxy": colour_proxy},
)

# ---------------------------------------------------------------- 2-D mixture


def mixture_prompts(seed: int, held_out_fraction: float) -> tuple[list[Prompt], list[Prompt]]:
    every = [Prompt(f"component {k}", (k,)) for k in range(4)]
    return every, every                                   # four prompts: no held-out split


def mixture_hit(points: torch.Tensor, prompts: list[Prompt]) -> torch.Tensor:
    """1 when the point's nearest component is the asked one.   [N, 2] -> [N]"""
    mix = default_mixture(points.device)
    asked = torch.tensor([p.labels[0] for p in prompts], device=points.device)
    return (nearest_component(mix, points.float()) == asked).float()


def mixture_centre(points: torch.Tensor, prompts: list[Prompt]) -> torch.Tensor:
    """exp(-distance to the asked component's mean): a graded reward.   [N, 2] -> [N]"""
    mix = default_mixture(points.device)
    asked = torch.tensor([p.labels[0] for p in prompts], device=points.device)
    return torch.exp(-(points.float() - mix.means[asked]).norm(dim=1))


def rightward(points: torch.Tensor, prompts: list[Prompt]) -> torch.Tensor:
    """The point's x coordinate, whatever was asked: a proxy that is hacked by moving everything right.  [N, 2] -> [N]"""
    return points[:, 0].float()


MIXTURE_TASK = FlowTask(
    vocab=[4], data_shape=lambda fc: (2,), prompts=mixture_prompts,
    new_model=lambda fc: MLPFlow([4], dim=fc.model_dim, depth=fc.model_depth),
    rewards={"geneval": mixture_hit, "compositional": mixture_hit, "centre": mixture_centre, "rightward": rightward},
    metrics={"compositional": mixture_hit, "gold": mixture_hit, "centre": mixture_centre, "rightward": rightward},
)

TASKS: dict[str, FlowTask] = {"shapes": SHAPES_TASK, "mixture": MIXTURE_TASK}


def diversity(samples: torch.Tensor, group_size: int) -> float:
    """Mean per-dimension std within groups of G samples of one prompt (0: the G samples are identical).

    Shape: [N, ...] with N = B * G -> float
    """
    flat = samples.float().flatten(1)
    return float(flat.view(-1, group_size, flat.shape[1]).std(dim=1).mean())
