"""One step's experience: prompts -> SDE rollouts (trajectory + log-probs) -> rewards -> advantages.

Every random draw of a step (initial noise, per-step noise, the variant's step plan) comes from a
generator keyed by (train.seed, step) on the model's device, so a resumed run redraws exactly what an
uninterrupted one would (no rollout state is kept across steps).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from grpo.flow.objective import FlowAdvantages, flow_advantages
from grpo.flow.sampler import Trajectory, guided, sde_sample
from grpo.flow.sde import SIGMA_SCHEDULES, time_grid
from grpo.flow.tasks import FlowTask, Prompt, diversity, labels_tensor
from grpo.flow.variants import VARIANTS, PlanArgs


def step_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    """The generator of one training step's draws, keyed by (seed, step)."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + step) % (2 ** 63))


class PromptStream:
    """Batches of training prompts, a fresh seeded shuffle every epoch; its position is checkpointed."""

    def __init__(self, prompts: list[Prompt], seed: int):
        self.prompts, self.seed = prompts, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> list[int]:
        g = torch.Generator(device="cpu").manual_seed(self.seed * 7919 + self.epoch)
        return torch.randperm(len(self.prompts), generator=g, device="cpu").tolist()   # host-side order

    def next_batch(self, n: int) -> list[Prompt]:
        out = []
        while len(out) < n:
            order = self._order()
            take = order[self.position:self.position + n - len(out)]
            out += [self.prompts[i] for i in take]
            self.position += len(take)
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "num_prompts": len(self.prompts)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_prompts") != len(self.prompts):
            raise ValueError(f"flow prompt stream: the checkpoint has {state.get('num_prompts')} training prompts, "
                             f"this run {len(self.prompts)} (flow.task / flow.held_out_fraction changed)")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


@dataclass
class FlowExperience:
    traj: Trajectory                 # states [N, S + 1, ...], logprobs [N, S]
    prompts: list[Prompt]            # [N], group by group
    rewards: torch.Tensor            # [N] training reward
    advantages: FlowAdvantages       # values [N]
    metrics: dict[str, float] = field(default_factory=dict)


def rollout_noise(g: torch.Generator, batch: int, group: int, shape: tuple, steps: int, share: bool,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial noise [B G, ...] (one per group when `share`) and the per-step z [S, B G, ...]."""
    x1 = torch.randn(batch, 1 if share else group, *shape, generator=g, device=device)
    x1 = x1.expand(batch, group, *shape).reshape(batch * group, *shape)
    return x1, torch.randn(steps, batch * group, *shape, generator=g, device=device)


def sampler_schedule(fc, variant_name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The training grid [S + 1] and sigma_{t_j} [S] of the variant (t clamped at the grid's second time)."""
    times = time_grid(fc.train_steps, device, fc.time_shift)
    sigma = SIGMA_SCHEDULES[VARIANTS[variant_name].sigma](times[:-1], fc.noise_level, float(times[1]))
    return times, sigma


@torch.no_grad()
def make_experience(model: torch.nn.Module, task: FlowTask, prompts: list[Prompt], cfg, step: int,
                    device: torch.device) -> FlowExperience:
    """Sample G trajectories per prompt, score them with flow.reward, compute the clipped advantages."""
    fc, G = cfg.flow, cfg.rollout.num_generations
    variant = VARIANTS[fc.variant]
    g = step_generator(cfg.train.seed, step, device)
    t0 = time.perf_counter()
    times, sigmas = sampler_schedule(fc, fc.variant, device)
    plan = variant.plan(PlanArgs(fc.train_steps, step, fc.window_size, fc.window_shift_every, fc.train_fraction), g)
    x1, z = rollout_noise(g, len(prompts), G, task.data_shape(fc), fc.train_steps, variant.share_noise, device)
    rows = [p for p in prompts for _ in range(G)]
    traj = sde_sample(guided(model, fc.guidance_scale), x1, labels_tensor(rows, device), times, sigmas, plan.sde,
                      plan.train, z, fc.logprob_reduction)
    sample_s = time.perf_counter() - t0
    rewards = task.rewards[fc.reward](traj.samples, rows)                     # [N]
    adv = flow_advantages(rewards, G, fc.std, fc.advantage_eps, fc.adv_clip)
    metrics = {"time/rollout_s": sample_s, "time/reward_s": time.perf_counter() - t0 - sample_s,
               "flow/diversity": diversity(traj.samples, G), "flow/sde_steps": float(plan.sde.sum()),
               "flow/trained_steps": float(plan.train.sum()), "advantages/clipped": float(adv.clipped),
               "advantages/zero_std_frac": adv.zero_std_groups / adv.num_groups,
               "reward/total/mean": float(rewards.mean()), "reward/total/std": float(rewards.std()),
               f"reward/{fc.reward}/mean": float(rewards.mean())}
    return FlowExperience(traj, rows, rewards, adv, metrics)
