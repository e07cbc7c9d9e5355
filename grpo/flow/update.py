"""The Flow-GRPO update: the trained (sample, step) pairs of a rollout batch, shuffled and split into
flow.updates_per_step optimizer steps, each accumulated over micro-batches of flow.micro_batch_size
pairs. The log-prob of a pair is recomputed by grpo.flow.sampler.step_logprob, the function the
rollout used, with the same (guided) velocity; the loss is grpo.flow.objective.flow_loss. The flow
counterpart of grpo/training/update.py: the only place of grpo/flow/ that calls backward().
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.flow.experience import FlowExperience
from grpo.flow.objective import flow_loss, pair_normalizer
from grpo.flow.sampler import guided, step_logprob
from grpo.flow.sde import gaussian_kl, sde_mean, sde_std


@dataclass
class FlowUpdateStats:
    loss: float
    policy_loss: float
    kl: float                  # mean closed-form KL per trained pair
    clip_fraction: float       # share of pairs whose ratio was clipped
    grad_norm: float           # before clipping
    lr: float
    ratio_max_dev: float       # max |rho - 1| over the pairs (0 at the first update: on-policy)


def trained_pairs(exp: FlowExperience) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, step) indices of every trained pair.   -> ([P] long, [P] long)"""
    steps = torch.nonzero(exp.traj.train).flatten()                          # [S_train]
    n = exp.traj.states.shape[0]
    rows = torch.arange(n, device=steps.device)
    return rows.repeat_interleave(steps.numel()), steps.repeat(n)


def pair_batch(exp: FlowExperience, rows: torch.Tensor, steps: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors of a set of pairs: x_j, x_{j+1}, t_j, h_j, sigma_j, labels, old log-prob, advantage."""
    tr = exp.traj
    return {"x": tr.states[rows, steps], "x_next": tr.states[rows, steps + 1], "t": tr.times[steps],
            "h": tr.times[steps] - tr.times[steps + 1], "sigma": tr.sigmas[steps], "cond": tr.cond[rows],
            "old": tr.logprobs[rows, steps], "adv": exp.advantages.values[rows]}


def pair_logprobs(model: torch.nn.Module, exp: FlowExperience, rows: torch.Tensor, steps: torch.Tensor,
                  guidance_scale: float, reduction: str) -> torch.Tensor:
    """log pi_theta of the given pairs, recomputed (for tests and diagnostics).   -> [P] float32"""
    b = pair_batch(exp, rows, steps)
    return step_logprob(guided(model, guidance_scale), b["x"], b["x_next"], b["t"], b["h"], b["sigma"], b["cond"],
                        reduction)[0]


def optimizer_step(policy, reference, optimizer, scheduler, exp: FlowExperience, rows, steps, fc,
                   max_grad_norm: float) -> FlowUpdateStats:
    """One optimizer step over the pairs (rows, steps), micro-batched."""
    velocity = guided(policy, fc.guidance_scale)
    ref_velocity = guided(reference, fc.guidance_scale) if reference is not None else None
    normalizer = pair_normalizer(rows.numel(), rows.device)
    optimizer.zero_grad(set_to_none=True)
    sums, dev = None, None            # on the device: FlowLossTerms.stats summed; the largest |ratio - 1|
    for lo in range(0, rows.numel(), fc.micro_batch_size):
        b = pair_batch(exp, rows[lo:lo + fc.micro_batch_size], steps[lo:lo + fc.micro_batch_size])
        logp, mu = step_logprob(velocity, b["x"], b["x_next"], b["t"], b["h"], b["sigma"], b["cond"],
                                fc.logprob_reduction)
        kl = None
        if ref_velocity is not None:
            with torch.no_grad():
                mu_ref = sde_mean(b["x"], ref_velocity(b["x"], b["t"], b["cond"]), b["t"], b["h"], b["sigma"])
            kl = gaussian_kl(mu, mu_ref, sde_std(b["sigma"], b["h"]), fc.logprob_reduction)   # [M]
        terms = flow_loss(logp, b["old"], b["adv"], fc.epsilon, normalizer, kl, fc.beta)
        terms.loss.backward()
        sums = terms.stats if sums is None else sums + terms.stats     # no host sync per micro-batch
        far = (logp.detach() - b["old"]).exp().sub(1).abs().max()
        dev = far if dev is None else torch.maximum(dev, far)
    params = [p for p in policy.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf")))
    lr = float(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
    loss, policy_loss, kl_sum, clipped, _ = sums.tolist() if sums is not None else [0.0] * 5   # one read a step
    return FlowUpdateStats(loss, policy_loss, kl_sum / rows.numel(), clipped / rows.numel(), grad_norm, lr,
                           float(dev) if dev is not None else 0.0)


def flow_update(policy, reference, optimizer, scheduler, exp: FlowExperience, fc, max_grad_norm: float,
                g: torch.Generator) -> list[FlowUpdateStats]:
    """flow.updates_per_step optimizer steps over the shuffled trained pairs of `exp`."""
    rows, steps = trained_pairs(exp)
    order = torch.randperm(rows.numel(), generator=g, device=g.device).to(rows.device)
    chunks = [c for c in order.tensor_split(fc.updates_per_step) if c.numel()]
    return [optimizer_step(policy, reference, optimizer, scheduler, exp, rows[c], steps[c], fc, max_grad_norm)
            for c in chunks]
