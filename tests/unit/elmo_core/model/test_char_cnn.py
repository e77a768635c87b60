import math
from unittest import mock

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_core.model import char_cnn
from elmo_core.model.char_cnn import CharCNN, _used_width, token_types, trim_tail
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids


def _hand_sized_encoder(activation: str) -> CharCNN:
    config = ModelConfig(
        char_cnn=CharCNNConfig(
            embedding_dim=2, filters=[(1, 1), (2, 1)], num_highway=0, activation=activation
        ),
        lstm=LSTMConfig(cell_dim=4, projection_dim=2),
    )
    encoder = CharCNN(config).double()
    with torch.no_grad():
        encoder.char_embedding.weight[3] = torch.tensor([1.0, 2.0])
        encoder.char_embedding.weight[5] = torch.tensor([-1.0, 1.0])
        encoder.convolutions[0].weight.copy_(torch.tensor([[[1.0], [-1.0]]]))  # (n, E, w)
        encoder.convolutions[0].bias.fill_(0.5)
        # out(p) = emb[p][0] + emb[p + 1][1] − 3
        encoder.convolutions[1].weight.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]))
        encoder.convolutions[1].bias.fill_(-3.0)
        encoder.projection.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        encoder.projection.bias.copy_(torch.tensor([0.1, 0.2]))
    return encoder


def test_valid_convolution_max_then_relu_matches_a_hand_computation():
    encoder = _hand_sized_encoder("relu")
    ids = torch.tensor([[3, 5, 0]])
    # width 1: [1 − 2, −1 − 1, 0 − 0] + 0.5 → max 0.5 → 0.5
    # width 2 (valid, 2 positions): [1 + 1, −1 + 0] − 3 = [−1, −4] → max −1 → relu 0
    # projection: [0.5·1 + 0·2 + 0.1, 0.5·3 + 0·4 + 0.2]
    expected = torch.tensor([[0.6, 1.7]], dtype=torch.float64)
    torch.testing.assert_close(encoder(ids), expected)


def test_tanh_activation_applies_to_the_maximum():
    encoder = _hand_sized_encoder("tanh")
    features = torch.tensor([math.tanh(0.5), math.tanh(-1.0)], dtype=torch.float64)
    expected = features @ encoder.projection.weight.T + encoder.projection.bias
    torch.testing.assert_close(encoder(torch.tensor([[3, 5, 0]]))[0], expected)


def test_padding_row_is_zero_and_receives_no_gradient():
    encoder = CharCNN(tiny())
    assert torch.all(encoder.char_embedding.weight[0] == 0)
    ids = torch.zeros(2, 50, dtype=torch.long)  # a padding token and one of char 5 only
    ids[1] = 5
    encoder(ids).sum().backward()
    assert torch.all(encoder.char_embedding.weight.grad[0] == 0)
    assert encoder.char_embedding.weight.grad[5].abs().sum() > 0


def test_matches_the_numpy_reference_with_highway_and_projection(numpy_reference):
    torch.manual_seed(0)
    encoder = CharCNN(tiny()).double()
    with torch.no_grad():  # make every branch matter: non-trivial highway and conv biases
        for parameter in encoder.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    ids = batch_to_ids([["The", "cat", "sat"], ["émigré", "Ω"]])  # (2, 3, 50) with a pad token
    expected = numpy_reference.char_cnn(
        ids.reshape(-1, 50).numpy(), numpy_reference.tf_char_cnn_from_module(encoder)
    ).reshape(2, 3, -1)
    np.testing.assert_allclose(encoder(ids).detach().numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("leading", [(7,), (2, 3), (2, 2, 2)])
def test_output_keeps_the_leading_shape(leading):
    encoder = CharCNN(tiny())
    ids = torch.randint(1, 262, (*leading, 50))
    assert encoder(ids).shape == (*leading, tiny().lstm.projection_dim)


def test_encoding_unique_types_equals_the_plain_path():
    torch.manual_seed(0)
    encoder = CharCNN(tiny()).double()
    ids = batch_to_ids([["a", "rose", "is", "a", "rose"], ["is", "a", "rose"], []])  # repeats, pads
    plain = encoder(ids)
    fast = encoder.encode_types(ids)
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)

    plain.sum().backward()
    plain_grads = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad()
    encoder.encode_types(ids).sum().backward()
    for plain_grad, parameter in zip(plain_grads, encoder.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, plain_grad, rtol=0, atol=1e-10)


def test_types_found_ahead_on_the_cpu_give_the_same_encoding_and_gradients():
    torch.manual_seed(0)
    encoder = CharCNN(tiny()).double()
    words = ["a", "rose", "is", "a", "rose", "is", "a", "roses"]
    table = batch_to_ids([words])[0].numpy().astype(np.int16)  # (8, W): a type table, rows repeat
    type_ids = np.array([[[0, 1, 2, 3], [1, -1, -1, -1]], [[7, 6, 5, -1], [4, 4, 0, 1]]])
    char_ids = torch.from_numpy(table[np.maximum(type_ids, 0)].astype(np.int64))
    char_ids[torch.from_numpy(type_ids < 0)] = 0  # (2, 2, 4, W) as the data path makes them
    types = token_types(type_ids, table)

    assert types.char_ids.shape[0] == len(np.unique(type_ids))
    torch.testing.assert_close(types.char_ids[types.inverse].long(), char_ids, rtol=0, atol=0)
    on_device = encoder.encode_types(char_ids)
    ahead = encoder.encode_types(char_ids, types)
    torch.testing.assert_close(ahead, on_device, rtol=0, atol=1e-12)
    on_device.sum().backward()
    expected = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad()
    ahead.sum().backward()
    for grad, parameter in zip(expected, encoder.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, grad, rtol=0, atol=1e-10)


class _Ops(TorchDispatchMode):
    """The names of the ops that run, backward included."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.names.add(func.__name__)
        return func(*args, **(kwargs or {}))


def test_the_gather_of_each_positions_type_sums_its_gradient_as_an_embedding_does():
    """The encoded types reach their positions by ``F.embedding``, whose backward sums a frequent
    word's thousands of positions in parallel pieces on CUDA; indexing's (``index_put_``) sums
    them one after another (2.1 ms of a 1,024-row step on an H200)."""
    encoder = CharCNN(tiny())
    char_ids = batch_to_ids([["a", "rose", "a", "a"], ["is", "a", "rose", "a"]])  # (2, 4, W)
    with _Ops() as ops:
        encoder.encode_types(char_ids).sum().backward()
    assert "embedding_dense_backward.default" in ops.names
    assert not {name for name in ops.names if "index_put" in name}


def test_trimming_the_constant_tail_keeps_features_and_gradients():
    """Short words use a few of the 50 slots; the pooled features must not see the cut."""
    torch.manual_seed(0)
    encoder = CharCNN(tiny()).double()
    ids = batch_to_ids([["a", "rose", "is", "a"], ["x" * 60]]).reshape(-1, 50)  # pads, one long
    for batch in (ids[:4], ids):  # a short-word batch is trimmed; the 48-byte token keeps all 50
        trimmed = trim_tail(batch, encoder.max_width, _used_width(batch))
        longest = 6  # bow, r, o, s, e, eow; then the widest filter (3) of tail is kept
        assert trimmed.shape[1] == (longest + 3 if batch is not ids else 50)
        encoder.zero_grad()
        fast = encoder(batch)
        fast.sum().backward()
        fast_grads = [p.grad.clone() for p in encoder.parameters()]

        encoder.zero_grad()
        with mock.patch("elmo_core.model.char_cnn.trim_tail", lambda char_ids, *_: char_ids):
            plain = encoder(batch)
        plain.sum().backward()
        torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)
        for fast_grad, parameter in zip(fast_grads, encoder.parameters(), strict=True):
            torch.testing.assert_close(fast_grad, parameter.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("conv_impl", ["per_width", "padded"])
def test_channels_last_convolutions_give_the_same_features_and_gradients(conv_impl, monkeypatch):
    """The CUDA form (2-D convolutions over channels-last views, the max over the positions of
    that storage) on the CPU, against the plain one; its gradient comes back channels-last."""
    torch.manual_seed(0)
    encoder = CharCNN(tiny().model_copy(update={"conv_impl": conv_impl})).double()
    ids = batch_to_ids([["a", "rose", "is", "a"], ["x" * 60, "roses"]])  # one token past the cut
    results = []
    for channels_last in (False, True):
        monkeypatch.setattr(char_cnn, "channels_last", lambda chars, on=channels_last: on)
        encoder.zero_grad()
        encoded = encoder(ids)
        encoded.pow(2).sum().backward()
        results.append([encoded, *(p.grad.clone() for p in encoder.parameters())])
    for plain, channels_last in zip(*results, strict=True):
        torch.testing.assert_close(channels_last, plain, rtol=0, atol=1e-10)

    chars = torch.randn(3, 9, 4, dtype=torch.float64).transpose(1, 2)  # (N, E, W') as embedded
    out = char_cnn._convolve(chars, torch.randn(5, 4, 3, dtype=torch.float64))
    assert out.shape == (3, 5, 7) and out.stride(1) == 1  # the filters innermost
    leaf = out.detach().requires_grad_()
    char_cnn._max_over_positions(leaf).sum().backward()
    assert leaf.grad.stride(1) == 1
