"""Both ``conv_impl``s against the filters spelled out: the same features and every gradient."""

from typing import cast

import pytest
import torch

from elmo_core.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_core.model.char_cnn import CharCNN, token_types
from elmo_core.text.char_ids import batch_to_ids, tokens_to_ids

# narrowest width 2, a gap at 4: the stacked kernel pads 3 filters to 5 columns
FILTERS = [(2, 3), (3, 4), (5, 2), (1, 2)]


def _encoder(conv_impl: str) -> CharCNN:
    config = ModelConfig(
        char_cnn=CharCNNConfig(embedding_dim=3, filters=FILTERS, num_highway=1),
        lstm=LSTMConfig(cell_dim=8, projection_dim=4),
        conv_impl=conv_impl,
        cpu_highway_bf16=False,  # the convolutions' parity, in float32 throughout
    )
    torch.manual_seed(0)
    encoder = CharCNN(config)
    with torch.no_grad():
        for conv in encoder.convolutions:
            cast(torch.Tensor, conv.bias).normal_()  # a tie with the padding rows' zeros is off
    return encoder


def _reference(encoder: CharCNN, char_ids: torch.Tensor) -> torch.Tensor:
    """Each filter over its own valid windows of all W chars: no Conv1d, no trimming, no padding,
    and ``amax`` (whose gradient splits over ties) for the max."""
    chars = encoder.char_embedding(char_ids)  # (N, W, E)
    pooled = []
    for conv in encoder.convolutions:
        assert isinstance(conv, torch.nn.Conv1d) and conv.bias is not None
        windows = chars.unfold(1, conv.kernel_size[0], 1)  # (N, W − w + 1, E, w)
        out = torch.einsum("npew,cew->npc", windows, conv.weight) + conv.bias  # (N, W − w + 1, n)
        pooled.append(out.amax(dim=1))  # (N, n)
    features = encoder.highway(encoder.activation(torch.cat(pooled, dim=-1)))  # (N, F)
    return encoder.projection(features)  # (N, P)


def _output_and_grads(encode, encoder, grad):
    encoder.zero_grad(set_to_none=True)
    output = encode()
    output.backward(grad)
    return output.detach(), {name: p.grad for name, p in encoder.named_parameters()}


BATCHES = {
    "short words, padding rows": [["a", "rose", "is", "hello"], ["aaaa"]],
    "a token too long to trim": [["émigré", "x" * 60], ["is"]],
}


@pytest.mark.parametrize("conv_impl", ["per_width", "padded"])
@pytest.mark.parametrize("words", BATCHES.values(), ids=BATCHES.keys())
def test_features_and_every_gradient_match_the_spelled_out_filters(conv_impl, words):
    encoder = _encoder(conv_impl)
    ids = batch_to_ids(words)  # (B, T, W), T padded with all-zero rows
    assert torch.any(ids.reshape(-1, 50).eq(0).all(dim=-1))  # a padding token
    grad = torch.randn(*ids.shape[:-1], encoder.output_dim)  # (B, T, P)

    expected, expected_grads = _output_and_grads(
        lambda: _reference(encoder, ids.reshape(-1, 50)).reshape(grad.shape), encoder, grad
    )
    type_ids = torch.arange(ids.shape[0] * ids.shape[1]).reshape(ids.shape[:2]).numpy()
    table = ids.reshape(-1, 50).numpy()
    types = token_types(type_ids, table)
    encodings = {
        "forward": lambda: encoder(ids),
        "types on the device": lambda: encoder.encode_types(ids),
        "types found ahead": lambda: encoder.encode_types(ids, types),
    }
    for name, encode in encodings.items():
        actual, actual_grads = _output_and_grads(encode, encoder, grad)
        torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6, msg=name)
        for parameter, expected_grad in expected_grads.items():
            torch.testing.assert_close(
                actual_grads[parameter], expected_grad, rtol=0, atol=1e-5, msg=parameter
            )
        assert torch.all(actual_grads["char_embedding.weight"][0] == 0)  # the padding id


def test_both_impls_share_one_state_dict():
    """bilm-tf imports and checkpoints load into either: the per-width Conv1d's are the
    parameters, the padded kernel is built from them on each call."""
    per_width, padded = _encoder("per_width"), _encoder("padded")
    assert per_width.state_dict().keys() == padded.state_dict().keys()
    padded.load_state_dict(per_width.state_dict())
    ids = torch.from_numpy(tokens_to_ids(["a", "rose"]).astype("int64"))  # (2, W)
    torch.testing.assert_close(padded(ids), per_width(ids), rtol=0, atol=1e-6)
