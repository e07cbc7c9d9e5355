"""Pre-training of the base flow model on the shapes world (rectified flow / conditional flow matching):

    x0 = a jittered render of a training scene, eps ~ N(0, I), t ~ U(0, 1), x_t = (1 - t) x0 + t eps
    L  = || v_theta(x_t, t, labels) - (eps - x0) ||^2        (labels dropped to null with p_drop, for CFG)

Only the training prompts of the split are seen, so held-out prompts are compositional generalisation.
Deterministic for a seed and a thread count:

    python -m grpo.flow.pretrain --out grpo/assets/shapes-flow --steps 3000 --threads 1 --patch 4 --dim 64 \
        --depth 3 --lr 2e-3 --batch-size 64 --field-drop 0 0.75 0

(the committed base of `grpo flow demo`; its README gives the measured numbers).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from grpo.flow.models import FlowModel
from grpo.flow.tasks import SHAPES_TASK, labels_tensor
from grpo.vision.shapes import render, to_tensor


def flow_matching_loss(v: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Mean squared error of v against the rectified-flow target eps - x0.   Shape: [N, ...] x3 -> []"""
    return ((v - (eps - x0)) ** 2).mean()


def interpolate(x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = (1 - t) x0 + t eps.   Shape: x0, eps [N, ...], t [N] -> [N, ...]"""
    tt = t.view(-1, *([1] * (x0.dim() - 1)))
    return (1 - tt) * x0 + tt * eps


def drop_labels(labels: torch.Tensor, null: torch.Tensor, p: float, g: torch.Generator) -> torch.Tensor:
    """Each row's labels replaced by the null labels with probability p (CFG training).   [N, K] -> [N, K]"""
    drop = torch.rand(labels.shape[0], generator=g, device=labels.device) < p
    return torch.where(drop[:, None], null, labels)


def drop_fields(labels: torch.Tensor, null: torch.Tensor, p_field: list[float], g: torch.Generator) -> torch.Tensor:
    """Each field k of each row replaced by its null label with probability p_field[k], independently: a
    caption that leaves out an attribute, so the model binds it weakly.   [N, K] -> [N, K]"""
    p = torch.tensor(p_field, dtype=torch.float32, device=labels.device)
    drop = torch.rand(labels.shape, generator=g, device=labels.device) < p
    return torch.where(drop, null, labels)


def training_set(prompts, variants: int, size: int, seed: int, device: torch.device):
    """`variants` jittered renders of each prompt's scene.   -> (images [P * variants, 3, H, W], labels [P * variants, K])"""
    rng = np.random.default_rng(seed)
    images = [to_tensor(render(p.scene, size, rng), device) for p in prompts for _ in range(variants)]
    return torch.stack(images), labels_tensor([p for p in prompts for _ in range(variants)], device)


def pretrain(model: FlowModel, images: torch.Tensor, labels: torch.Tensor, steps: int, batch_size: int, lr: float,
             seed: int, p_drop: float = 0.1, log_every: int = 50, on_save=None, save_every: int = 0,
             field_drop: list[float] | None = None) -> list[float]:
    """AdamW on the flow-matching loss; returns the loss of every step (`on_save(step)` every `save_every` steps).
    `field_drop` (one probability per label field) also drops single fields; all zero draws nothing more."""
    device = images.device
    g = torch.Generator(device=device).manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    null = model.null_cond(labels[:1])
    losses = []
    for step in range(steps):
        idx = torch.randint(0, images.shape[0], (batch_size,), generator=g, device=device)
        x0 = images[idx]
        eps = torch.randn(x0.shape, generator=g, device=device)
        t = torch.rand(batch_size, generator=g, device=device)
        cond = drop_labels(labels[idx], null.expand(batch_size, -1), p_drop, g)
        if field_drop is not None and any(field_drop):
            cond = drop_fields(cond, null.expand(batch_size, -1), field_drop, g)
        loss = flow_matching_loss(model(interpolate(x0, eps, t), t, cond), x0, eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_save is not None and save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            on_save(step + 1)
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{steps} loss {np.mean(losses[-log_every:]):.4f}", flush=True)
    return losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo.flow.pretrain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="Output directory (config.json, model.safetensors, pretrain.json).")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-seed", dest="split_seed", type=int, default=0, help="Seed of the train / held-out split.")
    p.add_argument("--held-out-fraction", dest="held_out_fraction", type=float, default=0.25)
    p.add_argument("--variants", type=int, default=32, help="Jittered renders per training prompt.")
    p.add_argument("--image-size", dest="image_size", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--label-drop", dest="label_drop", type=float, default=0.1)
    p.add_argument("--field-drop", dest="field_drop", type=float, nargs="+", default=None, metavar="P",
                   help="Also drop single label fields (shape, colour, position: one probability each) to their "
                        "null label: captions that leave an attribute out, so the base binds it weakly.")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default).")
    p.add_argument("--save-every", dest="save_every", type=int, default=0,
                   help="Also save OUT/step-N every N steps (to pick a calibration).")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    torch.manual_seed(args.seed)
    if args.field_drop is not None and len(args.field_drop) != len(SHAPES_TASK.vocab):
        p.error(f"--field-drop takes {len(SHAPES_TASK.vocab)} probabilities (shape, colour, position)")
    train, _ = SHAPES_TASK.prompts(args.split_seed, args.held_out_fraction)
    images, labels = training_set(train, args.variants, args.image_size, args.seed, device)
    from grpo.flow.models import TinyDiT

    with torch.device(device):
        model = TinyDiT(SHAPES_TASK.vocab, image_size=args.image_size, patch=args.patch, dim=args.dim,
                        depth=args.depth)
    start = time.perf_counter()
    out = Path(args.out)
    losses = pretrain(model, images, labels, args.steps, args.batch_size, args.lr, args.seed, args.label_drop,
                      on_save=lambda s: model.save_pretrained(out / f"step-{s}"), save_every=args.save_every,
                      field_drop=args.field_drop)
    wall = time.perf_counter() - start
    model.save_pretrained(out)
    (out / "pretrain.json").write_text(json.dumps({"args": vars(args), "wall_s": round(wall, 1),
                                                   "final_loss": float(np.mean(losses[-50:]))}, indent=1))
    print(f"saved {out} ({wall:.0f}s, final loss {np.mean(losses[-50:]):.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
