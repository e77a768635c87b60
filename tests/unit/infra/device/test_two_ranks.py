"""Two real gloo ranks at tiny sizes: the bytes each sends a step are those its rows and the
model's parameters make, and the ranks end with the same weights."""

import json

import pytest

from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.training.gradient_exchange import ring_bytes, softmax_rows_bound
from infra.device import two_ranks


def test_two_ranks_send_the_counted_bytes_and_end_with_one_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert two_ranks.main(["--smoke"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    config, vocab, rows, window = tiny(), 200, 4, 5  # --smoke's sizes
    bilm = BiLM(config, vocab)
    assert bilm.softmax is not None
    softmax = sum(p.numel() for p in bilm.softmax.parameters())
    dense = 4 * (sum(p.numel() for p in bilm.parameters()) - softmax)
    row = (config.lstm.projection_dim + 1) * 4  # weight and bias as float32
    assert summary["weights_equal"] is True
    for rank in summary["ranks"]:
        # both ranks train on the same windows here: their union is each one's rows
        assert rank["union_rows"] == rank["softmax_rows"] <= rank["softmax_rows_bound"]
        assert rank["softmax_rows_bound"] == softmax_rows_bound(
            vocab, rows, window, config.num_samples
        )
        sent = ring_bytes("all_reduce", rank["union_rows"] * row, 2)
        assert (rank["dense_bytes"], rank["softmax_bytes"]) == (dense, sent)
        timed = ("step_ms", "all_reduce_ms", "agree_ms", "union_exchange_ms", "gather_exchange_ms")
        assert all(rank[name] > 0 for name in timed)
        assert list(rank["sum_rows_ms"]) == [str(world) for world in two_ranks.SUMMING_WORLDS]
