import math

import pytest
import torch

from elmo_core.model.scalar_mix import ScalarMix


def _layers(num_layers=3, shape=(2, 4, 5), seed=0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator) for _ in range(num_layers)]


def test_at_init_the_mix_is_the_mean_of_the_layers():
    layers = _layers()
    mix = ScalarMix(3)
    torch.testing.assert_close(mix.weights(), torch.full((3,), 1 / 3))
    assert mix.gamma.item() == 1.0
    torch.testing.assert_close(mix(layers), torch.stack(layers).mean(0))


def test_mix_is_gamma_times_softmax_weighted_sum():
    layers = _layers(num_layers=2)
    mix = ScalarMix(2, initial_scalar_parameters=[0.0, math.log(3.0)])
    with torch.no_grad():
        mix.gamma.fill_(2.0)
    torch.testing.assert_close(mix(layers), 2.0 * (0.25 * layers[0] + 0.75 * layers[1]))


def test_masked_layer_norm_hand_computed():
    # One row of two positions, width 2; the second position is padding and must not count.
    layer = torch.tensor([[[1.0, 3.0], [100.0, -100.0]]])
    mask = torch.tensor([[True, False]])
    mix = ScalarMix(1, do_layer_norm=True)
    out = mix([layer], mask)
    # Unmasked elements 1 and 3: mean 2, variance 1 → (x − 2) / 1 everywhere (padding included).
    torch.testing.assert_close(out, torch.tensor([[[-1.0, 1.0], [98.0, -102.0]]]))


def test_layer_norm_statistics_span_all_unmasked_elements_of_a_layer():
    layers = _layers(num_layers=2, shape=(3, 6, 4))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]).bool()
    out = ScalarMix(2, do_layer_norm=True)(layers, mask)
    expected = []
    for layer in layers:
        real = layer[mask]  # (positions, D)
        mean, std = real.mean(), real.std(unbiased=False)
        expected.append((layer - mean) / std)
    torch.testing.assert_close(out, 0.5 * (expected[0] + expected[1]))


def test_layer_norm_without_a_mask_is_refused():
    with pytest.raises(ValueError, match="mask"):
        ScalarMix(2, do_layer_norm=True)(_layers(num_layers=2))


def test_wrong_number_of_layers_is_refused():
    with pytest.raises(ValueError, match="expected 3 layers"):
        ScalarMix(3)(_layers(num_layers=2))


def test_gradients_flow_to_weights_and_gamma():
    mix = ScalarMix(3)
    layers = _layers()
    (mix(layers) * torch.randn(2, 4, 5)).sum().backward()
    assert mix.scalar_parameters.grad is not None and mix.scalar_parameters.grad.abs().sum() > 0
    assert mix.gamma.grad is not None and mix.gamma.grad.abs().sum() > 0


def test_fixed_parameters_are_not_trainable():
    mix = ScalarMix(3, initial_scalar_parameters=[1.0, 2.0, 3.0], trainable=False)
    assert not any(parameter.requires_grad for parameter in mix.parameters())
    torch.testing.assert_close(mix.weights(), torch.softmax(torch.tensor([1.0, 2.0, 3.0]), 0))


def test_l2_penalty_is_lambda_times_squared_norm_of_raw_weights():
    mix = ScalarMix(3, initial_scalar_parameters=[1.0, -2.0, 0.5])
    assert mix.l2_penalty().item() == pytest.approx(0.001 * 5.25)
    assert mix.l2_penalty(0.1).item() == pytest.approx(0.525)
    assert ScalarMix(3).l2_penalty().item() == 0.0


def test_initial_parameters_must_match_the_number_of_layers():
    with pytest.raises(ValueError, match="3 layers"):
        ScalarMix(3, initial_scalar_parameters=[0.0, 1.0])
