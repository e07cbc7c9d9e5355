"""The flow models: batch-invariant outputs, CFG's null labels, save/load round trip, bad directories."""

import pytest
import torch

from grpo.flow.models import MLPFlow, RowLinear, TinyDiT, build_flow_model, load_flow_model, padded_act


def _randomised(model):
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


def test_row_linear_equals_linear_and_does_not_depend_on_the_batch():
    torch.manual_seed(0)
    lin = RowLinear(16, 8)
    x = torch.randn(9, 5, 16)
    assert torch.allclose(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), atol=1e-6)
    full = lin(x)
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(9)]), full)


def test_padded_activation_equals_the_activation_and_does_not_depend_on_the_batch():
    """Every element through the vectorised kernel: same values as F.silu (to its last bit), the shape kept,
    and each row of a 7-row tensor equal, bit for bit, to that row computed in any 3-row slice."""
    torch.manual_seed(0)
    x = torch.randn(7, 16)
    full = padded_act(torch.nn.functional.silu, x)
    assert full.shape == x.shape
    torch.testing.assert_close(full, torch.nn.functional.silu(x), rtol=1e-6, atol=1e-7)
    for i in range(5):
        assert torch.equal(padded_act(torch.nn.functional.silu, x[i:i + 3]), full[i:i + 3])


@pytest.mark.parametrize("make, shape", [(lambda: TinyDiT([3, 4, 4], image_size=8, patch=2, dim=16, depth=1, heads=2),
                                          (3, 8, 8)),
                                         (lambda: MLPFlow([4], dim=16, depth=2), (2,))])
def test_outputs_of_a_sample_do_not_depend_on_its_batch(make, shape):
    torch.manual_seed(0)
    model = _randomised(make())
    x, t = torch.randn(7, *shape), torch.rand(7)
    cond = torch.stack([torch.randint(0, v, (7,)) for v in model.cond.vocab], 1)
    with torch.no_grad():
        full = model(x, t, cond)
        assert full.shape == x.shape
        assert torch.equal(torch.cat([model(x[i:i + 3], t[i:i + 3], cond[i:i + 3]) for i in range(0, 7, 3)]), full)


def test_null_labels_are_one_past_each_field_and_change_the_output():
    torch.manual_seed(0)
    model = _randomised(TinyDiT([3, 4, 4], image_size=8, patch=2, dim=16, depth=1, heads=2))
    cond = torch.tensor([[0, 1, 2]])
    assert model.null_cond(cond).tolist() == [[3, 4, 4]]
    x, t = torch.randn(1, 3, 8, 8), torch.rand(1)
    assert not torch.allclose(model(x, t, cond), model(x, t, model.null_cond(cond)))


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = _randomised(TinyDiT([3, 4, 4], image_size=8, patch=4, dim=16, depth=1, heads=2))
    model.save_pretrained(tmp_path / "m")
    loaded = load_flow_model(tmp_path / "m")
    assert loaded.config == model.config
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    with pytest.raises(FileNotFoundError, match="not a flow model directory"):
        load_flow_model(tmp_path / "nothing")
    with pytest.raises(ValueError, match="model_type must be one of"):
        build_flow_model({"model_type": "unet"})
    with pytest.raises(ValueError, match="not a multiple of patch"):
        TinyDiT([3], image_size=10, patch=4)
