"""The `flow` section: Flow-GRPO for flow-matching image generators (grpo/flow/, docs/flow.md).

Shared keys keep their meaning: rollout.num_generations (G, images per prompt), train.* (max_steps,
seed, output_dir, resume, save_steps ...), optim.* (lr, warmup, max_grad_norm ...), health.*, log.*.
Registry names (flow.variant, flow.task, flow.reward, flow.std) are checked by grpo/flow/ before a run.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from grpo.config.errors import ConfigError
from grpo.config.fields import _f


@dataclass(frozen=True)
class FlowConfig:
    task: str = _f("shapes", "Prompt world and rewards: shapes (16x16 images of shape x colour x position, "
                   "grpo/flow/shapes_task.py) | mixture (2-D Gaussian mixture, the test bed).")
    model: str | None = _f("grpo/assets/shapes-flow", "Flow model directory (config.json + model.safetensors); empty = a "
                    "new model of flow.model_dim/model_depth/model_patch (random weights).")
    reward: str = _f("geneval", "Training reward: geneval (colour, position, shape, count checks) | "
                     "compositional (some object's colour, some object's position: extra blobs game it) | "
                     "compositional_main (the largest object's colour and position) | single (compositional_main / "
                     "number of objects) | colour_proxy (share of pixels near the prompt's colour: hackable).")
    variant: str = _f("flow_grpo", "flow_grpo | flow_grpo_fast (a random SDE window) | mix_grpo (a sliding "
                      "SDE window, ODE elsewhere) | dance_grpo (constant sigma, shared initial noise, a random "
                      "subset of steps trained, no KL).")
    noise_level: float = _f(0.7, "a in sigma_t = a sqrt(t / (1 - t)) (DanceGRPO: the constant sigma).")
    train_steps: int = _f(10, "Sampler steps of the training rollouts (SDE; the last one is an untrained ODE step).")
    eval_steps: int = _f(40, "ODE steps of evaluation sampling.")
    time_shift: float = _f(1.0, "SD3's time shift of the grid, t' = s t / (1 + (s - 1) t) (1 = uniform).")
    logprob_reduction: str = _f("mean", "Reduction of the Gaussian log-density over dimensions: mean | sum "
                                "(epsilon must fit it: ~1e-4 with mean, larger with sum).")
    epsilon: float = _f(1e-4, "Clip range of the ratio per (sample, step): [1 - eps, 1 + eps].")
    adv_clip: float = _f(5.0, "Advantages are clipped to [-adv_clip, adv_clip].")
    advantage_eps: float = _f(1e-4, "Added to the std of the advantage's denominator.")
    std: str = _f("group", "Advantage std: group (per prompt) | global (over the whole step's rewards).")
    beta: float = _f(0.004, "KL coefficient of ||mu_theta - mu_ref||^2 / (2 sigma^2 h) (reference: the frozen "
                     "initial model).")
    guidance_scale: float = _f(1.0, "Classifier-free guidance scale when sampling (1 = off; the update uses the "
                               "same guided velocity).")
    prompts_per_step: int = _f(8, "Prompts per training step (each sampled rollout.num_generations times).")
    updates_per_step: int = _f(2, "Optimizer steps per rollout batch (the trained pairs are split into this many "
                               "shuffled mini-batches; later ones are off-policy and get clipped).")
    micro_batch_size: int = _f(128, "(sample, step) pairs per forward/backward pass.")
    window_size: int = _f(2, "flow_grpo_fast / mix_grpo: SDE steps in the window.")
    window_shift_every: int = _f(10, "mix_grpo: training steps between shifts of the window by one step.")
    train_fraction: float = _f(0.6, "dance_grpo: share of the SDE steps trained.")
    split_seed: int = _f(0, "Seed of the train / held-out split of the prompts (the base model was pre-trained on "
                         "the training prompts of split 0).")
    held_out_fraction: float = _f(0.25, "Share of the prompts held out of training (and of pre-training).")
    train_unseen_fraction: float = _f(0.0, "Share of the held-out prompts (unseen in pre-training) that Flow-GRPO "
                                      "trains on; the evaluation keeps the rest, unseen by both stages (0 = none).")
    train_on_seen: bool = _f(True, "Flow-GRPO also trains on the prompts the base model was pre-trained on (false: "
                             "only on the flow.train_unseen_fraction share of the held-out prompts).")
    eval_samples: int = _f(4, "Images per held-out prompt at evaluation.")
    eval_every: int = _f(0, "Evaluate the held-out prompts every this many steps (0 = never during training).")
    image_size: int = _f(16, "Image side in pixels (the shapes world renders at this size).")
    model_dim: int = _f(64, "Width of a new model (flow.model empty).")
    model_depth: int = _f(4, "Transformer blocks (DiT) or hidden layers (MLP) of a new model.")
    model_patch: int = _f(4, "DiT patch size of a new model.")

    def __post_init__(self) -> None:
        positive = ("train_steps", "eval_steps", "prompts_per_step", "updates_per_step", "micro_batch_size",
                    "window_size", "window_shift_every", "eval_samples", "image_size", "model_dim", "model_depth",
                    "model_patch")
        checks = [(getattr(self, k) >= 1, f"flow.{k} must be >= 1, got {getattr(self, k)!r}") for k in positive]
        checks += [
            (self.train_steps >= 2, "flow.train_steps must be >= 2 (the last step is an untrained ODE step)"),
            (self.noise_level >= 0, f"flow.noise_level must be >= 0, got {self.noise_level}"),
            (self.epsilon >= 0, f"flow.epsilon must be >= 0, got {self.epsilon}"),
            (self.adv_clip > 0, f"flow.adv_clip must be > 0, got {self.adv_clip}"),
            (self.beta >= 0, f"flow.beta must be >= 0, got {self.beta}"),
            (self.time_shift > 0, f"flow.time_shift must be > 0, got {self.time_shift}"),
            (self.logprob_reduction in ("mean", "sum"), f"flow.logprob_reduction must be mean or sum, got "
                                                         f"{self.logprob_reduction!r}"),
            (self.std in ("group", "global"), f"flow.std must be group or global, got {self.std!r}"),
            (0 < self.train_fraction <= 1, f"flow.train_fraction must be in (0, 1], got {self.train_fraction}"),
            (0 < self.held_out_fraction < 1, f"flow.held_out_fraction must be in (0, 1), got {self.held_out_fraction}"),
            (0 <= self.train_unseen_fraction < 1, f"flow.train_unseen_fraction must be in [0, 1), got "
                                                   f"{self.train_unseen_fraction}"),
            (self.eval_every >= 0, f"flow.eval_every must be >= 0, got {self.eval_every}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


FLOW_KEYS = [f.name for f in fields(FlowConfig)]
