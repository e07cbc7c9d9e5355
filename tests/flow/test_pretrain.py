"""grpo/flow/pretrain.py: label dropping for classifier-free guidance and for weakly bound attributes."""

import torch

from grpo.flow.pretrain import drop_fields


def test_field_drop_nulls_single_fields_at_their_rates():
    labels = torch.tensor([[0, 1, 2]]).expand(20000, 3)
    null = torch.tensor([[3, 4, 4]]).expand(20000, 3)
    out = drop_fields(labels, null, [0.0, 0.75, 0.25], torch.Generator().manual_seed(0))
    dropped = (out == null).float().mean(0)
    assert dropped[0] == 0 and abs(dropped[1] - 0.75) < 0.015 and abs(dropped[2] - 0.25) < 0.015
    assert torch.equal(out[out != null], labels[out != null])                    # kept fields keep their labels
