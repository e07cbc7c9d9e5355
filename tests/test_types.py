"""grpo/types.py: the stage values; StepSummary.merge is what torchrun's metrics see."""

from dataclasses import fields

import pytest
import torch

from grpo.types import Scored, StepSummary


def summary(n: int, T: int, total: float, zero: int, sample_s: float, overlong: float) -> StepSummary:
    scored = Scored(["a"], torch.full((n, 1), total), torch.full((n,), total), {"a": 1})
    return StepSummary(scored, torch.ones(n, T, dtype=torch.long), torch.zeros(n, dtype=torch.bool), zero, 2,
                       sample_s, {"completion/overlong_filtered": overlong, "groups/kept": 2.0 * zero})


def test_merge_carries_every_field_over_ranks():
    """Two ranks' summaries merged as rank 0 would after all_gather_object (rows concatenated, counts summed,
    the slowest sampling time, summed and averaged metrics); a merge of one equals the summary itself."""
    a, b = summary(2, 3, 1.0, 1, 0.5, 1.0), summary(4, 5, 2.0, 0, 0.7, 2.0)
    m = StepSummary.merge([a.to_host(), b.to_host()])
    assert m.scored.total.tolist() == [1.0] * 2 + [2.0] * 4 and m.scored.errors == {"a": 2}
    assert m.completion_mask.shape == (6, 5) and int(m.completion_mask.sum()) == 2 * 3 + 4 * 5   # padded with 0
    assert (m.zero_std_groups, m.num_groups, m.sample_s) == (1, 4, 0.7)
    assert m.metrics == {"completion/overlong_filtered": 3.0, "groups/kept": 1.0}
    one = StepSummary.merge([a])
    for f in fields(StepSummary):                                          # every field survives
        x, y = getattr(one, f.name), getattr(a, f.name)
        assert (torch.equal(x, y) if isinstance(x, torch.Tensor) else
                torch.equal(x.total, y.total) if isinstance(x, Scored) else x == y), f.name


def test_merge_refuses_a_field_it_has_no_rule_for():
    from grpo.types import _merge

    with pytest.raises(TypeError, match="no rule for field 'x' of type str"):
        _merge(["a", "b"], "x")
