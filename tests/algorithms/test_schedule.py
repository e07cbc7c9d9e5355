import pytest


def test_one_lr_schedule_for_grpo_and_sft():
    """grpo.algorithms.schedule.lr_factor, hand-derived: warmup (s+1)/(W+1), then the decay to min_ratio;
    the GRPO optimizer and SFT use this very function."""
    import math

    from grpo.algorithms.schedule import lr_factor
    from grpo.config import OptimConfig
    from grpo.training import sft
    from grpo.training.update import build_optimizer
    from tests.conftest import tiny_qwen2

    assert [lr_factor(s, 3, 13, "cosine") for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lr_factor(8, 3, 13, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(8, 3, 13, "linear", min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(13, 3, 13, "cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(9, 0, 10, "constant") == 1.0
    with pytest.raises(ValueError, match="optim.lr_scheduler must be one of"):
        lr_factor(0, 0, 1, "step")
    _, sched = build_optimizer(tiny_qwen2(), OptimConfig(lr=1.0, warmup_steps=3, lr_scheduler="cosine"), 13)
    assert sched.lr_lambdas[0].func is lr_factor
    assert sft.lr_lambda(3, 13).func is lr_factor and sft.lr_lambda(3, 13)(13) == pytest.approx(0.1)
