"""The step plans of grpo/flow/variants.py (which sampler steps are SDE, which are trained)."""

import torch

from grpo.flow.variants import VARIANTS, PlanArgs, plan_all_but_last, plan_random_subset, plan_random_window, plan_sliding_window


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_flow_grpo_trains_every_step_but_the_last_ode_one():
    plan = plan_all_but_last(PlanArgs(5, 1, 2, 10, 0.6), _g())
    assert plan.sde.tolist() == [True, True, True, True, False]
    assert torch.equal(plan.train, plan.sde)


def test_mix_grpo_window_slides_from_high_to_low_noise_and_stops_at_the_last_trainable_step():
    starts = []
    for step in (1, 10, 11, 21, 200):
        plan = plan_sliding_window(PlanArgs(6, step, 2, 10, 0.6), _g())
        idx = torch.nonzero(plan.sde).flatten().tolist()
        assert len(idx) == 2 and idx[1] == idx[0] + 1 and torch.equal(plan.train, plan.sde)
        starts.append(idx[0])
    # (step - 1) // 10, capped at S - 1 - w = 3
    assert starts == [0, 0, 1, 2, 3]


def test_flow_grpo_fast_window_lies_in_the_first_half():
    for seed in range(20):
        idx = torch.nonzero(plan_random_window(PlanArgs(10, 1, 2, 10, 0.6), _g(seed)).sde).flatten().tolist()
        assert len(idx) == 2 and idx[0] <= 4 and idx[1] == idx[0] + 1


def test_dance_grpo_trains_a_random_subset_of_the_sde_steps():
    plan = plan_random_subset(PlanArgs(11, 1, 2, 10, 0.6), _g())
    assert plan.sde.sum() == 10 and not plan.sde[-1]
    assert plan.train.sum() == 6                       # ceil(0.6 * 10)
    assert not (plan.train & ~plan.sde).any()
    other = plan_random_subset(PlanArgs(11, 1, 2, 10, 0.6), _g(1))
    assert not torch.equal(plan.train, other.train)     # the subset changes with the draw


def test_registry_entries():
    assert VARIANTS["dance_grpo"].share_noise and not VARIANTS["dance_grpo"].kl
    assert VARIANTS["dance_grpo"].sigma == "constant" and VARIANTS["flow_grpo"].sigma == "flow"
    assert not VARIANTS["flow_grpo"].share_noise and VARIANTS["flow_grpo"].kl
