import json

import numpy as np
import pytest
import torch

from elmo_core.model.highway import CPU_HAS_BF16_GEMMS
from elmo_core.text.char_ids import tokens_to_ids


@pytest.fixture
def bench_char_cnn():
    from benchmarks import bench_char_cnn

    return bench_char_cnn


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
    runs = ("char_CNN_before", "char_CNN", "amax", "convolutions", "per_width", "padded")
    for run in (*runs, "highway", "highway_bf16", "projection", "step_before", "step"):
        assert summary[f"tiny_t1_{run}_s"] > 0
    assert 0 < summary["share_char_cnn_tiny_t1"] < 1
    assert 0 < summary["share_char_cnn_before_tiny_t1"] < 1
    assert summary["ratio_padded_tiny_t1"] == pytest.approx(
        summary["tiny_t1_per_width_s"] / summary["tiny_t1_padded_s"], rel=1e-2
    )
    assert summary["ratio"] == summary["ratio_padded_tiny_t1"]  # one setting: its own ratio
    assert summary["padded_grad_difference_tiny"] < 1e-4
    assert summary["max_grad_difference_tiny"] < 1e-4
    assert summary["ops_padded_tiny"] < summary["ops_per_width_tiny"] < summary["ops_amax_tiny"]
    assert summary["ops_char_CNN_padded_tiny"] < summary["ops_char_CNN_tiny"]
    # bf16 runs only where the CPU has bf16 GEMMs (elsewhere emulated, slower): then its output
    # differs from float32 by bf16's rounding; without them the highway stays in float32
    if CPU_HAS_BF16_GEMMS:
        assert 0 < summary["bf16_output_difference_tiny"] < 0.05
    else:
        assert summary["bf16_output_difference_tiny"] == 0
    assert summary["bf16_loss_difference_tiny"] < 0.02  # test_bilm_autocast's bar for the loss
