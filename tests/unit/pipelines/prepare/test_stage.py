"""prepare: counts against independent counts, shard contents, resumption, bad inputs."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from elmo_core.config import PrepareConfig
from elmo_core.data.reader import iter_sentences, load_manifest, load_vocab, load_word_types
from elmo_core.errors import DataError
from elmo_core.text.char_ids import token_to_ids
from elmo_core.text.tokenize import MosesTokenizer, Tokenizer
from elmo_core.text.vocab import SPECIALS
from pipelines.prepare import run as run_module
from pipelines.prepare.encode import encode_file
from pipelines.prepare.stage import prepare_files

LONG_TOKEN = "Überlänge" * 8  # 88 UTF-8 bytes: cut to 48 by the char ids
WORDS = ["the", "of", "a", "cat", "Cat", "sat", "é", "日本", ",", ".", LONG_TOKEN] + [
    f"w{i}" for i in range(40)
]


@dataclass(frozen=True)
class Corpus:
    source: str
    train: list[Path]
    heldout: list[Path]


def write_corpus(root: Path, num_train: int = 3, num_heldout: int = 2, lines: int = 150) -> Corpus:
    """A small 1B-Word-like corpus: Zipfian words, some blank lines, one long token."""
    rng = random.Random(0)
    weights = [1 / (rank + 1) for rank in range(len(WORDS))]
    files: dict[str, list[Path]] = {"train": [], "heldout": []}
    for split, count in (("train", num_train), ("heldout", num_heldout)):
        for number in range(count):
            path = root / split / f"news.en.{split}-{number:05d}"
            path.parent.mkdir(parents=True, exist_ok=True)
            rows = [
                " ".join(rng.choices(WORDS, weights, k=rng.randint(1, 12))) for _ in range(lines)
            ]
            rows[5] = "   "
            path.write_text("\n".join(rows[:7] + [""] + rows[7:]) + "\n", encoding="utf-8")
            files[split].append(path)
    return Corpus(str(root), files["train"], files["heldout"])


def sentences_of(paths: list[Path]) -> list[list[str]]:
    return [
        line.split() for path in paths for line in path.read_text().splitlines() if line.split()
    ]


def config(**overrides) -> PrepareConfig:
    options = dict(format="1b-benchmark", sentences_per_shard=100, sentences_per_row_group=40)
    return PrepareConfig(**{**options, **overrides})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared")
    corpus = write_corpus(root / "corpus")
    result = prepare_files(config(max_vocab=20), corpus, str(root / "out"))
    return corpus, result, str(root / "out")


def test_manifest_counts_match_independent_counts(prepared):
    corpus, result, out = prepared
    manifest = load_manifest(out)
    assert manifest == result.manifest
    train, heldout = sentences_of(corpus.train), sentences_of(corpus.heldout)
    counts = Counter(token for sentence in train for token in sentence)
    expected_vocab = sorted(counts, key=lambda t: (-counts[t], t.encode()))[:17]
    train_info, heldout_info = manifest.splits["train"], manifest.splits["heldout"]
    assert (train_info.num_sentences, heldout_info.num_sentences) == (len(train), len(heldout))
    assert train_info.num_tokens == sum(map(len, train))
    assert heldout_info.num_tokens == sum(map(len, heldout))
    oov = sum(n for token, n in counts.items() if token not in expected_vocab)
    assert train_info.num_oov_tokens == oov
    assert train_info.oov_rate == pytest.approx(oov / train_info.num_tokens)
    assert train_info.stats.blank_lines == 2 * len(corpus.train)
    assert train_info.stats.truncated_tokens == counts[LONG_TOKEN]
    assert manifest.stats.blank_lines == 2 * (len(corpus.train) + len(corpus.heldout))
    assert train_info.files == [f"train/{p.name}" for p in corpus.train]
    assert manifest.vocab.size == 20 and manifest.params.max_vocab == 20
    assert manifest.tokenizer["name"] == "whitespace"
    assert (Path(out) / "vocab.txt").read_text().splitlines() == [*SPECIALS, *expected_vocab]
    vocab = load_vocab(out)
    assert vocab.counts[3:].tolist() == [counts[t] for t in expected_vocab]
    assert vocab.counts[0] == len(train) and vocab.counts[2] == oov


def _decode(batch, tokens: np.ndarray) -> list[list[str]]:
    bounds = batch.offsets
    return [list(tokens[batch.types[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def test_shards_hold_every_sentence_once_train_shuffled_heldout_in_order(prepared):
    corpus, _, out = prepared
    types = load_word_types(out)
    tokens = np.array(types.tokens.to_pylist(), dtype=object)
    for row in (3, 10, len(types) - 1):
        np.testing.assert_array_equal(types.char_ids[row], token_to_ids(tokens[row]))
    train = []
    for batch in iter_sentences(out, "train"):
        np.testing.assert_array_equal(batch.targets, types.vocab_ids[batch.types])
        train += _decode(batch, tokens)
    expected = sentences_of(corpus.train)
    assert Counter(map(tuple, train)) == Counter(map(tuple, expected))
    assert train != expected  # shuffled
    heldout, where = [], []
    for batch in iter_sentences(out, "heldout"):
        heldout += _decode(batch, tokens)
        where += list(zip(batch.source_files, batch.lines.tolist(), strict=True))
    assert heldout == sentences_of(corpus.heldout)
    first = corpus.heldout[0].read_text().splitlines()
    assert [(f, first[n - 1].split()) for f, n in where[:3]] == [
        (f"heldout/{corpus.heldout[0].name}", s) for s in heldout[:3]
    ]


def test_one_and_two_workers_write_identical_shards(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=2, num_heldout=1, lines=60)
    one = prepare_files(config(workers=1), corpus, str(tmp_path / "one")).manifest
    two = prepare_files(config(workers=2), corpus, str(tmp_path / "two")).manifest
    assert one.splits == two.splits and one.word_types == two.word_types


def test_rerun_skips_finished_shards_and_rebuilds_deleted_or_corrupted_ones(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    first = prepare_files(config(), corpus, str(out))
    total = first.num_shards_written
    assert list(first.phase_seconds) == ["count", "vocabulary", "encode", "shuffle"]
    again = prepare_files(config(), corpus, str(out))
    assert (again.num_shards_written, again.num_shards_skipped) == (0, total)
    assert "count" not in again.phase_seconds  # the counting was reused
    (out / "train/part-00001.parquet").unlink()
    (out / "heldout/part-00000.parquet").write_bytes(b"not parquet")
    (out / "word_types.parquet").unlink()
    (out / "train/.part-00001.parquet.k2j3h4ab").write_bytes(b"a killed worker's temporary")
    repaired = prepare_files(config(), corpus, str(out))
    assert (repaired.num_shards_written, repaired.num_shards_skipped) == (2, total - 2)
    assert repaired.manifest == first.manifest  # word_types.parquet too, by its sha256
    assert sum(b.num_sentences for b in iter_sentences(str(out), "train")) == len(
        sentences_of(corpus.train)
    )
    assert not list(out.rglob("*.tmp*")) and not (out / ".prepare-work").exists()
    assert not list(out.rglob(".*"))


def test_a_crash_in_pass_2_resumes_without_counting_again(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    calls = []

    def crash_on_second_file(task):
        calls.append(task)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return encode_file(task)

    monkeypatch.setattr(run_module, "encode_file", crash_on_second_file)
    with pytest.raises(KeyboardInterrupt):
        prepare_files(config(), corpus, str(out))
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    resumed = prepare_files(config(), corpus, str(out))
    assert "count" not in resumed.phase_seconds  # the type order in the work directory was reused
    fresh = prepare_files(config(), corpus, str(tmp_path / "fresh"))
    assert resumed.manifest == fresh.manifest
    assert not list(out.rglob("*.tmp*")) and not (out / ".prepare-work").exists()


def test_a_shard_changed_after_prepare_fails_when_read(prepared, tmp_path):
    import shutil

    _, _, out = prepared
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shard = copy / "train/part-00000.parquet"
    shard.write_bytes(shard.read_bytes()[:-9] + b"corrupted")
    with pytest.raises(DataError, match="copy/train/part-00000.parquet: shard checksum"):
        list(iter_sentences(str(copy), "train"))


def _assert_nothing_written(out: Path) -> None:
    assert not (out / "manifest.json").exists()
    assert not [p for p in out.rglob("*") if ".tmp" in p.name] if out.exists() else True


def test_missing_and_empty_inputs_are_data_errors_and_leave_no_manifest(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=2, num_heldout=1, lines=20)
    missing = Corpus("x", [*corpus.train, tmp_path / "gone"], corpus.heldout)
    with pytest.raises(DataError, match="gone: input file not found"):
        prepare_files(config(), missing, str(tmp_path / "out"))
    _assert_nothing_written(tmp_path / "out")
    (tmp_path / "empty").write_text("\n\n")
    empty = Corpus("x", corpus.train, [tmp_path / "empty"])
    with pytest.raises(DataError, match="empty: input file is empty"):
        prepare_files(config(), empty, str(tmp_path / "out"))
    _assert_nothing_written(tmp_path / "out")


def test_invalid_utf8_fails_naming_file_and_line_or_is_counted(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=1, lines=20)
    with corpus.train[0].open("ab") as handle:
        handle.write(b"caf\xe9 au lait\n")
    with pytest.raises(DataError, match=r"news.en.train-00000:22: invalid UTF-8"):
        prepare_files(config(on_invalid_utf8="fail"), corpus, str(tmp_path / "out"))
    _assert_nothing_written(tmp_path / "out")
    result = prepare_files(config(), corpus, str(tmp_path / "out"))
    assert result.manifest.splits["train"].stats.invalid_utf8_replacements == 1


def test_long_lines_are_split_or_dropped_and_counted(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=1, lines=20)
    with corpus.train[0].open("a") as handle:  # a word found only in the long line
        handle.write(" ".join(["w1"] * 24 + ["only-here"]) + "\n")
    split = prepare_files(config(max_tokens_per_line=12), corpus, str(tmp_path / "split"))
    dropped = prepare_files(
        config(max_tokens_per_line=12, on_long_line="drop"), corpus, str(tmp_path / "drop")
    )
    base = len(sentences_of(corpus.train)) - 1
    assert split.manifest.splits["train"].num_sentences == base + 3
    assert split.manifest.splits["train"].stats.long_lines_split == 1
    assert dropped.manifest.splits["train"].num_sentences == base
    assert dropped.manifest.splits["train"].stats.long_lines_dropped == 1
    assert "only-here" not in load_word_types(str(tmp_path / "drop")).tokens.to_pylist()


def test_imported_vocabulary_with_specials_anywhere_and_maxtermid(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=1, lines=30)
    vocab_file = tmp_path / "vocab-2016-09-10.txt"
    vocab_file.write_text("the\n</S>\nof\n<S>\n!!!MAXTERMID\nnever-seen\n<UNK>\ncat\n")
    result = prepare_files(config(vocab_file=str(vocab_file)), corpus, str(tmp_path / "out"))
    vocab = (tmp_path / "out/vocab.txt").read_text().splitlines()
    assert vocab == [*SPECIALS, "the", "of", "never-seen", "cat"]
    assert result.manifest.vocab.imported_from == str(vocab_file)
    types = load_word_types(str(tmp_path / "out"))
    assert types.tokens.to_pylist()[:7] == vocab and types.counts[5] == 0
    bad = tmp_path / "bad.txt"
    bad.write_text("the\nof\n<S>\n")
    with pytest.raises(DataError, match="bad.txt: vocabulary lacks the special tokens"):
        prepare_files(config(vocab_file=str(bad)), corpus, str(tmp_path / "bad-out"))
    _assert_nothing_written(tmp_path / "bad-out")


def test_text_format_uses_moses_and_a_seeded_heldout_fraction(tmp_path):
    text = tmp_path / "book.txt"
    text.write_text(
        "".join(f"Sentence {i} is here. And another one, Mr. Smith!\n" for i in range(200))
    )
    corpus = Corpus(str(text), [text], [])
    cfg = config(format="text", heldout_fraction=0.2, seed=3)
    manifest = prepare_files(cfg, corpus, str(tmp_path / "a")).manifest
    assert isinstance(Tokenizer.from_manifest(manifest.tokenizer), MosesTokenizer)
    train, heldout = manifest.splits["train"], manifest.splits["heldout"]
    assert train.num_sentences + heldout.num_sentences == 400
    assert 40 < heldout.num_sentences < 120 and heldout.files == ["book.txt"]
    again = prepare_files(cfg, corpus, str(tmp_path / "b")).manifest
    assert again.splits == manifest.splits
    other = prepare_files(
        config(format="text", heldout_fraction=0.2, seed=4), corpus, str(tmp_path / "c")
    )
    assert other.manifest.splits["heldout"].shards != heldout.shards


def test_a_second_run_into_the_same_output_reads_the_new_word_type_table(tmp_path):
    """One process, two corpora, one output: the second run must not reuse the first type table."""
    first = write_corpus(tmp_path / "first", num_train=1, num_heldout=1, lines=40)
    second = write_corpus(tmp_path / "second", num_train=1, num_heldout=1, lines=40)
    with second.train[0].open("a") as handle:
        handle.write("words only the second corpus has\n")
    out, fresh = str(tmp_path / "out"), str(tmp_path / "fresh")
    prepare_files(config(), first, out)
    prepare_files(config(), second, out, overwrite=True)
    prepare_files(config(), second, fresh)
    for split in ("train", "heldout"):
        got = [batch.types.tolist() for batch in iter_sentences(out, split)]
        assert got == [batch.types.tolist() for batch in iter_sentences(fresh, split)]


def _shard_files(out: Path) -> set[str]:
    return {str(path.relative_to(out)) for path in out.glob("*/*.parquet")}


def test_another_dataset_in_the_output_is_refused_and_overwrite_replaces_it_whole(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=2, num_heldout=1, lines=120)
    out = tmp_path / "out"
    old = prepare_files(config(sentences_per_shard=50), corpus, str(out)).manifest
    old_files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(DataError, match=r"out: the output holds another dataset.*--overwrite"):
        prepare_files(config(sentences_per_shard=500), corpus, str(out))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == old_files  # untouched

    new = prepare_files(config(sentences_per_shard=500), corpus, str(out), overwrite=True).manifest
    listed = {shard.path for split in new.splits.values() for shard in split.shards}
    assert len(listed) < sum(len(split.shards) for split in old.splits.values())
    assert _shard_files(out) == listed  # none of the old dataset's extra shards is left
    assert load_manifest(str(out)) == new


def test_a_shard_the_manifest_does_not_list_is_removed_when_the_run_finishes(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=1, lines=40)
    out = tmp_path / "out"
    manifest = prepare_files(config(), corpus, str(out)).manifest
    stray = out / "train" / "part-00042.parquet"
    stray.write_bytes((out / manifest.splits["train"].shards[0].path).read_bytes())
    prepare_files(config(), corpus, str(out))  # the same dataset: verified, then swept
    assert not stray.exists()
    assert _shard_files(out) == {s.path for split in manifest.splits.values() for s in split.shards}


def test_an_output_with_files_prepare_did_not_write_is_refused_even_with_overwrite(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=1, lines=40)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("a colleague's notes")
    with pytest.raises(DataError, match=r"holds files prepare did not write \(notes.txt\)"):
        prepare_files(config(), corpus, str(out), overwrite=True)
    assert [path.name for path in out.iterdir()] == ["notes.txt"]


def test_replaced_invalid_utf8_is_one_warning_line_with_the_count(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=1, lines=20)
    with corpus.train[0].open("ab") as handle:
        handle.write(b"caf\xe9 au lait \xff\xfe\n")  # three bytes that are not UTF-8
    prepare_files(config(), corpus, str(tmp_path / "out"))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    assert re.search(r"warning: 3 invalid UTF-8 .* on_invalid_utf8=fail", warnings[0])


def test_a_shared_dataset_follows_the_umask(tmp_path):
    """A team's umask 002: every file group-writable 0664, every directory 0775."""
    import os

    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=1, lines=40)
    previous = os.umask(0o002)
    try:
        prepare_files(config(), corpus, str(tmp_path / "out"))
    finally:
        os.umask(previous)
    written = list((tmp_path / "out").rglob("*"))
    assert {path.stat().st_mode & 0o777 for path in written if path.is_file()} == {0o664}
    assert {path.stat().st_mode & 0o777 for path in written if path.is_dir()} == {0o775}


def test_prepare_is_an_mlflow_run_with_sizes_the_manifest_and_the_dataset_as_input(
    tmp_path, monkeypatch
):
    from mlflow import MlflowClient

    from elmo_core.data.manifest import manifest_sha256
    from pipelines.prepare.stage import prepare, prepare_run_id
    from pipelines.tracking import stage_runs

    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(stage_runs.PARENT_RUN_ENV, raising=False)
    corpus = write_corpus(tmp_path / "corpus", num_train=1, num_heldout=0, lines=60)
    result = prepare(PrepareConfig(format="text"), str(corpus.train[0]), str(tmp_path / "ds"))

    run = stage_runs.find_run("prepare-ds", "prepare")  # <stage>-<subject>, as every stage run
    assert run is not None and run.info.status == "FINISHED"
    train = result.manifest.splits["train"]
    assert run.data.metrics["train_tokens"] == train.num_tokens
    assert run.data.metrics["vocabulary_size"] == result.manifest.vocab.size
    assert run.data.params["format"] == "text"
    assert "sha256" not in run.data.params  # a None setting is left out, not logged as "None"
    assert "None" not in run.data.params.values()
    assert "system/cpu_utilization_percentage" in run.data.metrics
    client = MlflowClient(stage_runs.use_tracking())
    assert {item.path for item in client.list_artifacts(run.info.run_id)} >= {
        "manifest.json",
        "prepare_config.json",
    }
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.digest == manifest_sha256(result.dataset)[:36]
    profile = json.loads(dataset_input.dataset.profile)  # MLflow's dataset drawer shows both
    assert profile["train_sentences"] == train.num_sentences
    assert profile["heldout_tokens"] == result.manifest.splits["heldout"].num_tokens
    assert profile["vocabulary"] == result.manifest.vocab.size
    schema = json.loads(dataset_input.dataset.schema)
    assert [column["name"] for column in schema["mlflow_colspec"]] == ["types"]
    description = run.data.tags[stage_runs.DESCRIPTION_TAG].split("\n\n")
    assert description[0] == f"Prepared {corpus.train[0]} into {result.dataset}."
    assert description[1].startswith(f"train: {train.num_sentences:,} sentences, ")
    assert prepare_run_id(result.dataset) == run.info.run_id  # what a flow's summary links
    shards = len(train.shards)
    assert description[1].endswith(f"%, {shards} shard{'s' if shards != 1 else ''}")
    assert description[-1].startswith(f"vocabulary {result.manifest.vocab.size:,} of ")


def _all_sentences(out: str) -> list[list[str]]:
    types = load_word_types(out)
    tokens = np.array(types.tokens.to_pylist(), dtype=object)
    return [
        sentence
        for split in ("train", "heldout")
        for batch in iter_sentences(out, split)
        for sentence in _decode(batch, tokens)
    ]


def test_tokenized_format_keeps_tokens_exactly_as_split_on_whitespace(tmp_path):
    rng = random.Random(0)
    words = [
        "Mr.",
        "isn't",
        "z.B.",
        "(",
        "„Hallo“",
        ",",
        "...",
        "北京",
        "欢迎",
        "你",
        "。",
        "Straße",
    ]
    lines = [" ".join(rng.choices(words, k=rng.randint(1, 8))) for _ in range(300)]
    text = tmp_path / "segmented.txt"
    text.write_text("\n".join(lines[:10] + ["  "] + lines[10:]) + "\n", encoding="utf-8")
    cfg = config(format="tokenized", heldout_fraction=0.3, seed=5)
    manifest = prepare_files(cfg, Corpus(str(text), [text], []), str(tmp_path / "out")).manifest

    assert manifest.format == "tokenized" and manifest.tokenizer["name"] == "whitespace"
    sentences = _all_sentences(str(tmp_path / "out"))
    assert Counter(map(tuple, sentences)) == Counter(tuple(line.split()) for line in lines)
    train, heldout = manifest.splits["train"], manifest.splits["heldout"]
    assert 50 < heldout.num_sentences < 130 and heldout.files == ["segmented.txt"]
    assert train.num_sentences + heldout.num_sentences == len(lines)


def test_a_german_text_corpus_goes_through_german_moses_and_records_the_language(tmp_path):
    text = tmp_path / "de.txt"
    text.write_text(
        "Wir treffen uns z.B. Montag. Wie geht's? Das ist Nr. 5 der Liste.\n" * 30,
        encoding="utf-8",
    )
    cfg = config(format="text", heldout_fraction=0.0, tokenizer={"lang": "de"})
    out = str(tmp_path / "out")
    manifest = prepare_files(cfg, Corpus(str(text), [text], []), out).manifest

    assert manifest.tokenizer["lang"] == "de" and manifest.params.tokenizer.lang == "de"
    assert Tokenizer.from_manifest(manifest.tokenizer).describe() == manifest.tokenizer
    assert Counter(map(tuple, _all_sentences(out))) == {
        ("Wir", "treffen", "uns", "z.B.", "Montag", "."): 30,
        ("Wie", "geht", "'", "s", "?"): 30,
        ("Das", "ist", "Nr.", "5", "der", "Liste", "."): 30,
    }


def test_english_by_default_leaves_the_tokenizer_section_out_of_the_manifest(tmp_path):
    """Datasets prepared before the language was configurable keep their bytes and identity."""
    text = tmp_path / "en.txt"
    text.write_text("Mr. Smith went to Washington. He left.\n" * 20)
    cfg = config(format="text")
    prepare_files(cfg, Corpus(str(text), [text], []), str(tmp_path / "out"))

    raw = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "tokenizer" not in raw["params"] and raw["tokenizer"]["lang"] == "en"
    assert "tokenizer" not in cfg.dataset_params()
    assert load_manifest(str(tmp_path / "out")).params == cfg
