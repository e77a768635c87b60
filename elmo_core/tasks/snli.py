"""Sentence-pair reader for SNLI (Bowman et al. 2015) jsonl files; MultiNLI uses the same fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from elmo_core.errors import DataError
from elmo_core.tasks.dataset import PairExample, TaskDataset, finish_dataset, iter_lines

Tokenization = Literal["binary_parse", "whitespace"]
NO_GOLD_LABEL = "-"


def read_snli(
    path: str | Path, *, tokenization: Tokenization = "binary_parse"
) -> TaskDataset[PairExample]:
    """Read an SNLI/MultiNLI jsonl file into premise/hypothesis/label examples.

    Pairs without a consensus label (``gold_label`` ``-``) are skipped by convention, counted as
    ``skipped["no_gold_label"]``; pairs with an empty sentence as ``skipped["empty_sentence"]``.
    ``binary_parse`` takes the tokens from the ``sentence*_binary_parse`` leaves (the corpus's own
    PTB tokenization; whitespace where a line has none), ``whitespace`` splits the raw sentences.
    """
    examples: list[PairExample] = []
    skipped = {"no_gold_label": 0, "empty_sentence": 0}
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        record = _parse_record(line, path, number)
        label = _string_field(record, "gold_label", path, number).strip()
        if label in ("", NO_GOLD_LABEL):
            skipped["no_gold_label"] += 1
            continue
        premise = _tokens(record, "sentence1", tokenization, path, number)
        hypothesis = _tokens(record, "sentence2", tokenization, path, number)
        if not premise or not hypothesis:
            skipped["empty_sentence"] += 1
            continue
        examples.append(PairExample(premise=premise, hypothesis=hypothesis, label=label))
    return finish_dataset(path, examples, skipped)


def _parse_record(line: str, path: str | Path, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(
            f"invalid JSON: {err.msg} (column {err.colno})", path=path, line=number
        ) from None
    if not isinstance(record, dict):
        raise DataError(
            f"expected a JSON object, got {type(record).__name__}", path=path, line=number
        )
    return record


def _string_field(record: dict[str, Any], key: str, path: str | Path, number: int) -> str:
    if key not in record:
        raise DataError(f"missing field '{key}'", path=path, line=number)
    value = record[key]
    if not isinstance(value, str):
        raise DataError(f"field '{key}' is not a string", path=path, line=number)
    return value


def _tokens(
    record: dict[str, Any], key: str, tokenization: Tokenization, path: str | Path, number: int
) -> list[str]:
    parse_key = f"{key}_binary_parse"
    if tokenization == "binary_parse" and parse_key in record:
        parse = _string_field(record, parse_key, path, number)
        return [token for token in parse.split() if token not in ("(", ")")]
    return _string_field(record, key, path, number).split()
