import json
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_core.model.char_cnn import CharCNN, _trim_tail
from elmo_core.text.char_ids import batch_to_ids, tokens_to_ids

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_char_cnn.py"


@pytest.fixture
def bench_char_cnn(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import bench_char_cnn

    return bench_char_cnn


def _per_width_reference(encoder: CharCNN, char_ids: torch.Tensor) -> torch.Tensor:
    """Each filter over its own valid windows, spelled out: no Conv1d, no padding, no mask."""
    chars = encoder.char_embedding(char_ids)  # (N, W, E)
    pooled = []
    for conv in encoder.convolutions:
        assert isinstance(conv, torch.nn.Conv1d) and conv.bias is not None
        windows = chars.unfold(1, conv.kernel_size[0], 1)  # (N, W − w + 1, E, w)
        out = torch.einsum("npew,cew->npc", windows, conv.weight) + conv.bias  # (N, W − w + 1, n)
        pooled.append(torch.relu(out.amax(dim=1)))  # (N, n)
    return torch.cat(pooled, dim=-1)  # (N, F)


@pytest.mark.parametrize("trim", [True, False])
def test_one_padded_convolution_gives_the_per_width_features_and_every_gradient(
    bench_char_cnn, trim
):
    config = ModelConfig(  # narrowest width 2, a gap at 4: the padding is widest − narrowest
        char_cnn=CharCNNConfig(embedding_dim=3, filters=[(2, 3), (3, 4), (5, 2)], num_highway=1),
        lstm=LSTMConfig(cell_dim=8, projection_dim=4),
    )
    torch.manual_seed(0)
    encoder = CharCNN(config).double()
    with torch.no_grad():
        for conv in encoder.convolutions:
            conv.bias.normal_()
    ids = batch_to_ids([["a", "rose", "is"], ["émigré", "x" * 60]]).reshape(-1, 50)  # a padding
    ids = _trim_tail(ids, encoder.max_width) if trim else ids  # 50: the long token has no tail
    grad = torch.randn(ids.shape[0], 9, dtype=torch.float64)

    results = []
    for pool in (_per_width_reference, bench_char_cnn.padded_pool):
        encoder.zero_grad(set_to_none=True)
        pooled = pool(encoder, ids)
        pooled.backward(grad)
        results.append(
            (pooled, {n: p.grad for n, p in encoder.named_parameters() if p.grad is not None})
        )
    (expected, expected_grads), (actual, actual_grads) = results

    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)
    assert set(actual_grads) == set(expected_grads)
    assert set(expected_grads) >= {
        f"convolutions.{i}.{p}" for i in range(3) for p in ("weight", "bias")
    }
    for name, expected_grad in expected_grads.items():
        torch.testing.assert_close(actual_grads[name], expected_grad, rtol=0, atol=1e-10)
    assert torch.all(actual_grads["char_embedding.weight"][0] == 0)  # the padding ids


def test_text_windows_run_forward_and_backward_through_the_text(bench_char_cnn, tmp_path):
    words = [f"w{index}" for index in range(40)]  # each once: its id is its place in the text
    text = tmp_path / "text.tokens"
    text.write_text(" ".join(words[:20]) + "\n" + " ".join(words[20:]) + "\n", encoding="utf-8")

    windows, types, targets = bench_char_cnn.text_windows(text, rows=3, window=4, vocab=30)

    assert windows["forward_inputs"].shape == (3, 4, 50) and targets.shape == (2, 3, 4)
    table = torch.from_numpy(tokens_to_ids(words).astype(np.int64))  # (40, W)
    for stream, step in ((0, 1), (1, -1)):  # the backward stream reads the text reversed
        name = ("forward", "backward")[stream]
        inputs = windows[f"{name}_inputs"]  # (B, T, W)
        ids = (inputs.unsqueeze(2) == table).all(dim=-1).int().argmax(dim=-1)  # (B, T)
        torch.testing.assert_close(table[ids], inputs)
        assert torch.all(ids[:, 1:] - ids[:, :-1] == step)
        expected = np.minimum(ids.numpy() + step, 29)  # the next word; past 30 words, the last id
        np.testing.assert_array_equal(targets[stream], expected)
        np.testing.assert_array_equal(windows[f"{name}_targets"].numpy(), expected)
    both = torch.stack([windows["forward_inputs"], windows["backward_inputs"]])  # (2, B, T, W)
    torch.testing.assert_close(types.char_ids[types.inverse].long(), both)


def test_smoke_run_checks_agreement_times_every_run_and_ends_with_json(bench_char_cnn, capsys):
    threads = torch.get_num_threads()
    assert bench_char_cnn.main(["--smoke"]) == 0
    assert torch.get_num_threads() == threads

    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["benchmark"] == "char_cnn" and summary["repeats"] == 2
    for run in ("char_CNN", "per_width", "convolutions", "padded", "highway", "projection", "step"):
        assert summary[f"tiny_t1_{run}_s"] > 0
    assert summary["tiny_t1_highway_bf16_s"] > 0 and 0 < summary["share_char_cnn_tiny_t1"] < 1
    assert summary["ratio_padded_tiny_t1"] == pytest.approx(
        summary["tiny_t1_per_width_s"] / summary["tiny_t1_padded_s"], rel=1e-2
    )
    assert summary["ratio"] == summary["ratio_padded_tiny_t1"]  # one setting: its own ratio
    assert summary["padded_grad_difference_tiny"] < 1e-4
    assert summary["ops_padded_tiny"] < summary["ops_per_width_tiny"] < summary["ops_char_CNN_tiny"]
    assert summary["bf16_output_difference_tiny"] > 0  # bf16 really ran
