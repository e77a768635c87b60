import math

import numpy as np
import pytest
import torch

from elmo_core.model.highway import CPU_HAS_BF16_GEMMS, Highway


def _set_layer(highway: Highway, index: int, tf_weights: dict[str, np.ndarray]) -> None:
    """Load TF row-vector weights ``x·W + b`` into torch ``Linear`` (weight = Wᵀ)."""
    with torch.no_grad():
        highway.carry[index].weight.copy_(torch.from_numpy(tf_weights["W_carry"].T))
        highway.carry[index].bias.copy_(torch.from_numpy(tf_weights["b_carry"]))
        highway.transform[index].weight.copy_(torch.from_numpy(tf_weights["W_transform"].T))
        highway.transform[index].bias.copy_(torch.from_numpy(tf_weights["b_transform"]))


def test_one_layer_matches_a_hand_computation():
    highway = Highway(2, 1).double()
    _set_layer(
        highway,
        0,
        {
            "W_carry": np.zeros((2, 2)),
            "b_carry": np.array([0.0, math.log(3.0)]),  # gates 1/2 and 3/4
            "W_transform": np.array([[1.0, 2.0], [0.0, -1.0]]),
            "b_transform": np.array([0.0, 0.5]),
        },
    )
    x = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    # x·W_transform + b = [1, 2 − 3 + 0.5] = [1, −0.5] → relu [1, 0]
    # y = g·relu + (1 − g)·x = [0.5·1 + 0.5·1, 0.75·0 + 0.25·3]
    expected = torch.tensor([[1.0, 0.75]], dtype=torch.float64)
    torch.testing.assert_close(highway(x), expected)


def test_non_symmetric_weights_follow_the_row_vector_convention(numpy_reference):
    rng = np.random.default_rng(0)
    layers = [
        {
            "W_carry": rng.normal(size=(5, 5)),
            "b_carry": rng.normal(size=5),
            "W_transform": rng.normal(size=(5, 5)),
            "b_transform": rng.normal(size=5),
        }
        for _ in range(2)
    ]
    highway = Highway(5, 2).double()
    for index, layer in enumerate(layers):
        _set_layer(highway, index, layer)
    x = rng.normal(size=(3, 5))
    expected = numpy_reference.highway(x, layers)
    np.testing.assert_allclose(highway(torch.from_numpy(x)).detach().numpy(), expected, atol=1e-12)
    transposed = [{**layer, "W_carry": layer["W_carry"].T} for layer in layers]
    assert not np.allclose(numpy_reference.highway(x, transposed), expected)  # the test can tell


def test_carry_bias_starts_at_minus_two_and_transform_bias_at_zero():
    highway = Highway(8, 2)
    for carry, transform in zip(highway.carry, highway.transform, strict=True):
        assert torch.all(carry.bias == -2.0)
        assert torch.all(transform.bias == 0.0)


def test_zero_layers_is_the_identity_on_any_leading_shape():
    x = torch.randn(2, 3, 4)
    assert torch.equal(Highway(4, 0)(x), x)
    assert Highway(4, 1)(x).shape == (2, 3, 4)


def test_gradients_match_finite_differences():
    torch.manual_seed(0)
    highway = Highway(3, 2).double()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(highway, (x,))


@pytest.mark.skipif(not CPU_HAS_BF16_GEMMS, reason="this CPU has no bf16 GEMMs: float32 runs")
def test_cpu_bf16_trains_in_bf16_close_to_float32_and_evaluates_in_float32():
    torch.manual_seed(0)
    highway = Highway(64, 2)
    x = torch.randn(32, 64)
    expected = highway(x).detach()  # float32 (cpu_bf16 off)
    highway.cpu_bf16 = True
    trained = highway(x)
    assert trained.dtype == torch.float32 and not torch.equal(trained, expected)  # bf16 ran
    scale = float(expected.abs().max())  # test_bilm_autocast's bar for bf16 activations
    torch.testing.assert_close(trained, expected, rtol=0, atol=0.05 * scale)
    trained.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in highway.parameters())
    assert torch.equal(highway.eval()(x), expected)  # evaluation stays float32


def test_an_outer_autocast_still_applies_when_cpu_bf16_is_off():
    torch.manual_seed(0)
    highway = Highway(64, 1).eval()
    x = torch.randn(8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = highway(x)
    assert not torch.equal(mixed.float(), highway(x))
