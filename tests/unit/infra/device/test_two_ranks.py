"""Two real gloo ranks at tiny sizes: the bytes each sends a step are those the scaling model
counts, and the ranks end with the same weights."""

import json

import pytest

from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.training.gradient_exchange import softmax_rows_bound
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
    bound = softmax_rows_bound(vocab, rows, window, config.num_samples)
    row = (config.lstm.projection_dim + 1) * 4 + 8  # weight and bias as float32, an int64 id
    assert summary["weights_equal"] is True
    for rank in summary["ranks"]:
        assert (rank["dense_bytes"], rank["softmax_bytes"]) == (dense, bound * row)
        assert rank["step_ms"] > 0 and rank["all_reduce_ms"] > 0 and rank["rows_exchange_ms"] > 0
        assert list(rank["union_ms"]) == [str(world) for world in two_ranks.UNION_WORLDS]
