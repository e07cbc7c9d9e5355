"""An SD3 transformer of diffusers (tiny, built from a config) in our sampler: the ODE sampler on the
scheduler's sigmas equals diffusers' own FlowMatchEulerDiscreteScheduler loop; noise_level 0 equals it too."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from grpo.flow.diffusers_adapter import DiffusersVelocity, scheduler_times  # noqa: E402
from grpo.flow.sampler import guided, ode_sample, sde_sample  # noqa: E402
from grpo.flow.sde import flow_sigma  # noqa: E402

CPU = torch.device("cpu")


def _tiny():
    torch.manual_seed(0)
    tr = diffusers.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=1,
                                         attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                         caption_projection_dim=16, pooled_projection_dim=8, out_channels=4,
                                         pos_embed_max_size=8)
    with torch.no_grad():
        for p in tr.parameters():
            p.normal_(0, 0.05)
    embeds, pooled = torch.randn(3, 5, 16), torch.randn(3, 8)     # two prompts and the negative one
    return tr, DiffusersVelocity(tr, embeds, pooled)


def test_ode_sampler_equals_the_diffusers_scheduler_loop_with_cfg():
    tr, vel = _tiny()
    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[0], [1]])
    times = scheduler_times(sched, 6, CPU)
    assert times[0].item() == 1.0 and times[-1].item() == 0.0 and times.numel() == 7
    with torch.no_grad():
        ours = ode_sample(guided(vel, 4.0), x, labels, times)
        sched.set_timesteps(6)
        ref = x.clone()
        for ts in sched.timesteps:                      # what an SD3 pipeline does with do_classifier_free_guidance
            both = tr(hidden_states=torch.cat([ref, ref]), timestep=ts.expand(4),
                      encoder_hidden_states=torch.cat([vel.prompt_embeds[[0, 1]], vel.prompt_embeds[[2, 2]]]),
                      pooled_projections=torch.cat([vel.pooled_embeds[[0, 1]], vel.pooled_embeds[[2, 2]]]),
                      return_dict=False)[0]
            cond, uncond = both.chunk(2)
            ref = sched.step(uncond + 4.0 * (cond - uncond), ts, ref, return_dict=False)[0]
    assert torch.allclose(ours, ref, atol=1e-5)


def test_sde_at_noise_level_zero_on_the_scheduler_grid_is_the_ode():
    _, vel = _tiny()
    times = scheduler_times(diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0), 4, CPU)
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([[0], [1]])
    every = torch.ones(4, dtype=torch.bool)
    with torch.no_grad():
        traj = sde_sample(vel, x, labels, times, flow_sigma(times[:-1], 0.0, float(times[1])), every, every,
                          torch.randn(4, 2, 4, 8, 8))
        assert torch.equal(traj.samples, ode_sample(vel, x, labels, times))


def test_other_schedulers_are_refused():
    with pytest.raises(ValueError, match="only FlowMatchEulerDiscreteScheduler"):
        scheduler_times(diffusers.DDIMScheduler(), 4, CPU)
