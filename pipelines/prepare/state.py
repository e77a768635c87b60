"""The resumption record of a prepare run, ``prepare_state.json`` in the output directory.

It names the run (the fingerprint of config, tokenizer and inputs), keeps pass 1's outcome
(:class:`CountSummary`) so that a resumed run need not count again, and lists every finished file
with its sha256: the word-type table and each shard. A re-run verifies them
(:meth:`pipelines.prepare.output.DatasetOutput.load_state`) and redoes what is missing.
"""

from __future__ import annotations

from pydantic import BaseModel

from elmo_core.data.manifest import ShardInfo, SplitStats


class CountSummary(BaseModel):
    """Pass-1 outcome: what the manifest needs from the counting, and which type order it made."""

    stats: dict[str, SplitStats]
    num_sentences: dict[str, int]
    num_tokens: dict[str, int]
    num_oov_tokens: dict[str, int]
    heldout_sentences: list[int]  # per input file, in input order
    vocab_size: int
    num_types: int
    imported_vocab: str | None
    checksums: dict[str, str]  # vocab.txt, vocab_counts.tsv
    type_order: str  # sha256 of the type order file: which word-type table the shards index


class PrepareState(BaseModel):
    """Which run (fingerprint), its counting result, and its finished files."""

    fingerprint: str
    count: CountSummary | None = None
    word_types: str | None = None  # sha256 of the finished word_types.parquet
    shards: dict[str, ShardInfo] = {}

    def restart_with(self, count: CountSummary) -> None:
        """A new counting result: what was built from another type order is void."""
        if self.count is None or self.count.type_order != count.type_order:
            self.shards = {}
            self.word_types = None
        self.count = count
