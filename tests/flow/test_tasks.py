"""Rewards and metrics of the shapes task on rendered images: the exact render scores 1 everywhere, an
image painted in the prompt's colour games the proxy but not the gold metric, a wrong colour fails."""

import pytest
import torch

from grpo.flow.tasks import SHAPES_TASK, diversity, mixture_hit, Prompt
from grpo.vision.shapes import COLOUR_RGB, render, to_tensor


def test_the_exact_render_passes_every_check():
    train, held = SHAPES_TASK.prompts(0, 0.25)
    assert len(train) == 36 and len(held) == 12
    assert not {p.text for p in train} & {p.text for p in held}
    ps = held[:4]
    images = torch.stack([to_tensor(render(p.scene), "cpu") for p in ps])
    for name in ("geneval", "compositional", "gold", "exact"):
        assert SHAPES_TASK.metrics[name](images, ps).tolist() == [1.0] * 4, name


def test_a_painted_image_games_the_proxy_but_not_the_gold_metric():
    p = SHAPES_TASK.prompts(0, 0.25)[1][0]
    rgb = torch.tensor(COLOUR_RGB[p.scene.objects[0].colour], dtype=torch.float32) / 127.5 - 1
    painted = rgb.view(1, 3, 1, 1).expand(1, 3, 16, 16).clone()
    exact = to_tensor(render(p.scene), "cpu")[None]
    proxy, gold = SHAPES_TASK.metrics["colour_proxy"], SHAPES_TASK.metrics["gold"]
    assert proxy(painted, [p]).item() == 1.0 and gold(painted, [p]).item() == 0.0
    assert 0.05 < proxy(exact, [p]).item() < 0.3 and gold(exact, [p]).item() == 1.0


def test_a_wrong_colour_fails_compositional():
    p = SHAPES_TASK.prompts(0, 0.25)[1][0]
    other = next(c for c in COLOUR_RGB if c != p.scene.objects[0].colour)
    from grpo.vision.shapes import Obj, Scene

    wrong = Scene((Obj(p.scene.objects[0].shape, other, p.scene.objects[0].position),))
    img = to_tensor(render(wrong), "cpu")[None]
    assert SHAPES_TASK.metrics["compositional"](img, [p]).item() == 0.0
    assert SHAPES_TASK.rewards["geneval"](img, [p]).item() == 0.75     # count, position and shape right


def test_mixture_reward_and_diversity():
    pts = torch.tensor([[2.0, 2.1], [-2.0, -2.0]])
    assert mixture_hit(pts, [Prompt("c0", (0,)), Prompt("c0", (0,))]).tolist() == [1.0, 0.0]
    # groups of 2: identical pair -> 0; [0, 2] -> unbiased std sqrt(2)
    x = torch.tensor([[1.0], [1.0], [0.0], [2.0]])
    assert abs(diversity(x, 2) - 2 ** 0.5 / 2) < 1e-6


def test_placement_rewards_the_asked_quadrant_and_colour_only():
    from grpo.flow.tasks import placement

    ps = SHAPES_TASK.prompts(0, 0.25)[1][:6]
    exact = torch.stack([to_tensor(render(p.scene), "cpu") for p in ps])
    assert placement(exact, ps).tolist() == [1.0] * 6
    assert placement(exact.roll(8, dims=3), ps).tolist() == [0.0] * 6         # moved to the other column
    assert placement(-torch.ones_like(exact), ps).tolist() == [0.0] * 6       # nothing lit
    doubled = torch.maximum(exact, exact.roll(8, dims=2))                       # a copy in the other row too
    assert placement(doubled, ps).tolist() == [0.5] * 6


def test_extra_blobs_game_compositional_but_not_compositional_main_and_cost_the_single_reward():
    from grpo.flow.tasks import main_compositional, single

    ps = SHAPES_TASK.prompts(0, 0.25)[1][:4]
    exact = torch.stack([to_tensor(render(p.scene), "cpu") for p in ps])
    assert main_compositional(exact, ps).tolist() == [1.0] * 4 and single(exact, ps).tolist() == [1.0] * 4
    # the object copied into the other three quadrants: 4 equal blobs, the main one (first found) may be any
    four = torch.maximum(torch.maximum(exact, exact.roll(8, dims=2)), torch.maximum(exact.roll(8, dims=3),
                                                                                    exact.roll((8, 8), dims=(2, 3))))
    assert SHAPES_TASK.metrics["compositional"](four, ps).tolist() == [1.0] * 4     # gamed
    assert SHAPES_TASK.metrics["gold"](four, ps).tolist() == [0.0] * 4
    assert all(v in (0.0, 0.25) for v in single(four, ps).tolist())
    # a small extra blob: the main object still passes compositional, single halves
    speck = exact.clone()
    q = ps[0].scene.objects[0].position
    r, c = (1 if q.startswith("bottom") else 12), (1 if q.endswith("right") else 12)
    speck[0, :, r:r + 2, c:c + 2] = 1.0                  # a white 2x2 blob (4 px) in the opposite quadrant
    assert main_compositional(speck[:1], ps[:1]).item() == 1.0 and single(speck[:1], ps[:1]).item() == 0.5
    # a larger blob of the wrong colour elsewhere: the main object is the wrong one
    bigger = exact[:1].clone()
    bigger[0, :, max(r - 2, 0):max(r - 2, 0) + 6, max(c - 2, 0):max(c - 2, 0) + 6] = 1.0   # 36 white px
    assert main_compositional(bigger, ps[:1]).item() == 0.0


def test_run_prompts_moves_a_share_of_the_held_out_prompts_into_training():
    from grpo.config.flow import FlowConfig
    from grpo.config.schema import ConfigError
    from grpo.flow.tasks import SHAPES_TASK, run_prompts

    def run(seed, unseen=0.0, train_on_seen=True):
        fc = FlowConfig(split_seed=seed, held_out_fraction=0.25, train_unseen_fraction=unseen, train_on_seen=train_on_seen)
        return run_prompts(SHAPES_TASK, fc)

    seen, held = SHAPES_TASK.prompts(0, 0.25)
    assert run(0) == (seen, held)                     # 0: the task's split as it is
    train, evaluation = run(0, 0.5)
    assert train[:len(seen)] == seen and len(train) == 36 + 6 and len(evaluation) == 6
    moved = train[len(seen):]
    assert sorted(p.text for p in moved + evaluation) == sorted(p.text for p in held)   # a partition of the held out
    assert not set(p.text for p in moved) & set(p.text for p in evaluation)
    assert run(0, 0.5) == (train, evaluation)         # keyed by the seed
    assert run(1, 0.5)[1] != evaluation
    assert run(0, 0.5, train_on_seen=False) == (moved, evaluation)
    with pytest.raises(ConfigError, match="flow.train_unseen_fraction"):
        run(0, 0.99)                                   # nothing left to evaluate on
    with pytest.raises(ConfigError, match="flow.train_on_seen"):
        run(0, 0.0, train_on_seen=False)               # nothing left to train on

