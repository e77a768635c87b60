"""The evaluation record: its trapped rows, and records written before they were counted."""

from __future__ import annotations

import json
from pathlib import Path

from elmo_core.perplexity import describe_trapped_rows
from pipelines.evaluate.result import EvaluationResult

RECORD = {
    "forward_perplexity": 284.4,
    "backward_perplexity": 116.8,
    "perplexity": 182.3,
    "num_tokens": 40_000,
    "split": "heldout",
    "files": None,
    "protocol": "batched",
    "heldout_hash": "ab" * 32,
    "run_id": "r1",
}


def test_a_record_written_before_trapped_rows_were_counted_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "evaluation.json"
    path.write_text(json.dumps(RECORD), encoding="utf-8")
    result = EvaluationResult.read(path)
    assert (result.forward_trapped, result.backward_trapped, result.num_rows) == (0, 0, 0)


def test_trapped_rows_round_trip(tmp_path: Path) -> None:
    result = EvaluationResult(**RECORD, forward_trapped=9, backward_trapped=0, num_rows=128)
    result.write(tmp_path / "evaluation.json")
    assert EvaluationResult.read(tmp_path / "evaluation.json") == result


def test_trapped_rows_are_described_per_direction_only_where_some_locked_up() -> None:
    assert describe_trapped_rows(0, 0, 128) == ""
    assert (
        describe_trapped_rows(9, 0, 128) == "forward: 9 of 128 rows locked up (cells at the clip)"
    )
    assert describe_trapped_rows(1, 2, 4) == (
        "forward: 1 of 4 rows locked up (cells at the clip); "
        "backward: 2 of 4 rows locked up (cells at the clip)"
    )
