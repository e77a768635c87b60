"""Sense probe: the file format and its errors, nearest-centroid accuracy, the shipped demo set."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.analysis.senses import (
    SenseExample,
    check_senses,
    read_sense_splits,
    read_senses,
    sense_probe,
    sense_sentences,
    target_vectors,
)
from elmo_core.errors import DataError
from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.tasks.activation_cache import ActivationCache, CachedActivations

DEMO = Path(__file__).resolve().parents[4] / "examples" / "analysis" / "data"


def write(tmp_path: Path, text: str, name: str = "senses.tsv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def example(sense: str, tokens: str = "the bank", index: int = 1, line: int = 1) -> SenseExample:
    return SenseExample(tokens.split(), index, sense, sense.partition("%")[0], line)


def test_read_senses_parses_fields_and_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# sense<TAB>index<TAB>sentence\n"
        "bank%money\t3\twe went to bank today .\n"
        "\n"
        "bark%tree\t1\tthe  bark is rough\r\n",
    )
    first, second = read_senses(path)
    assert first == SenseExample(
        ["we", "went", "to", "bank", "today", "."], 3, "bank%money", "bank", 2
    )
    assert first.word == "bank"
    assert (second.tokens, second.lemma, second.line, second.word) == (
        ["the", "bark", "is", "rough"],
        "bark",
        4,
        "bark",
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("bank%money\t3", r"2 tab-separated fields; expected 3"),
        ("bank%money\t1\tthe bank\textra", r"4 tab-separated fields"),
        ("bank%money\tone\tthe bank", r"word index 'one' is not an integer"),
        ("bank%money\t5\tthe bank is closed", r"index 5 is out of range for a sentence of 4 tok"),
        ("bank%money\t4\tthe bank is closed", r"index 4 is out of range .* 0\.\.3"),
        ("bank%money\t-1\tthe bank", r"word index -1 is out of range"),
        ("bank%money\t0\t   ", r"empty sentence"),
        ("bankmoney\t1\tthe bank", r"sense 'bankmoney' is not 'word%name'"),
        ("%money\t1\tthe bank", r"sense '%money' is not"),
        ("bank%\t1\tthe bank", r"sense 'bank%' is not"),
    ],
)
def test_read_senses_names_file_and_line_of_a_bad_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = write(tmp_path, f"# header\nbank%river\t1\tthe bank\n{line}\n")
    with pytest.raises(DataError, match=message) as caught:
        read_senses(path)
    assert (caught.value.path, caught.value.line) == (str(path), 3)
    assert str(caught.value).startswith(f"{path}:3: ")


def test_read_senses_refuses_a_file_without_examples_and_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"empty.tsv: no examples in file"):
        read_senses(write(tmp_path, "# only a comment\n\n", "empty.tsv"))
    with pytest.raises(DataError, match=r"missing.tsv: file not found"):
        read_senses(tmp_path / "missing.tsv")


def test_check_senses_lists_test_lemmas_without_training_examples(tmp_path: Path) -> None:
    train = [example("bank%money"), example("bank%river")]
    test = [example("bank%money"), example("bat%animal", line=7), example("cell%phone", line=9)]
    test.append(example("bat%sport", line=12))
    with pytest.raises(DataError, match=r"'bat' \(line 7\), 'cell' \(line 9\)") as caught:
        check_senses(train, test, tmp_path / "test.tsv")
    assert caught.value.path == str(tmp_path / "test.tsv")
    check_senses(train, [example("bank%fish")])  # an unseen sense of a seen lemma is allowed


def test_read_sense_splits_checks_lemmas_before_any_work(tmp_path: Path) -> None:
    train = write(tmp_path, "bank%money\t1\tthe bank\n", "train.tsv")
    test = write(tmp_path, "bank%money\t0\tbank\nbat%animal\t1\ta bat\n", "test.tsv")
    with pytest.raises(DataError, match=r"test.tsv: test lemmas .* 'bat' \(line 2\)"):
        read_sense_splits(train, test)


def test_probe_scores_a_context_free_layer_as_the_baseline_and_a_separable_one_perfectly() -> None:
    # Layer 0 gives every occurrence the same vector (a tie: the most frequent sense, money);
    # layer 1 puts money along x and river along y.
    train_senses = ["bank%river", "bank%money", "bank%money"]
    train = np.array([[[1.0, 2.0], [0.0, 1.0]], [[1.0, 2.0], [1.0, 0.0]], [[1.0, 2.0], [2.0, 0.0]]])
    test_senses = ["bank%money", "bank%river", "bank%river", "bank%money"]
    test = np.array([[[1.0, 2.0], [3.0, 0.1]], [[1.0, 2.0], [0.1, 5.0]]] * 2)
    test[2:] = test[2:][::-1]  # rows: money, river, river, money

    result = sense_probe(train, train_senses, test, test_senses)

    assert result.layer_accuracies == [0.5, 1.0]
    assert result.mfs_accuracy == 0.5
    assert result.train_accuracies == pytest.approx([2 / 3, 1.0])  # beside it: its own data
    assert result.best_layer == 1
    assert (result.num_train, result.num_test, result.num_lemmas, result.num_senses) == (3, 4, 1, 2)
    assert result.num_unseen_senses == 0


def test_probe_breaks_near_ties_toward_the_most_frequent_sense_despite_rounding() -> None:
    # Means of 0.1 over 3 and over 2 rows differ in the last bit; the tie still goes to `b`.
    vector = [[0.1, 0.7]]
    train = np.array([vector] * 5)
    train_senses = ["w%a", "w%b", "w%b", "w%a", "w%b"]
    result = sense_probe(train, train_senses, np.array([vector] * 2), ["w%a", "w%b"])
    assert result.layer_accuracies == [0.5]
    assert result.mfs_accuracy == 0.5


def test_probe_takes_the_most_frequent_sense_by_name_when_counts_tie() -> None:
    train = np.array([[[1.0]], [[1.0]]])
    result = sense_probe(train, ["w%zeta", "w%alpha"], np.array([[[1.0]]]), ["w%alpha"])
    assert result.mfs_accuracy == 1.0
    assert result.layer_accuracies == [1.0]


def test_probe_uses_cosine_similarity_not_euclidean_distance() -> None:
    # The test vector is nearer `small` in distance (1.0 vs 9.0) but points along `large`.
    train = np.array([[[10.0, 0.0]], [[0.0, 1.0]]])
    test = np.array([[[1.0, 0.9]]])
    euclidean = np.linalg.norm(train[:, 0] - test[0, 0], axis=1)
    assert euclidean.argmin() == 1
    result = sense_probe(train, ["w%large", "w%small"], test, ["w%large"])
    assert result.layer_accuracies == [1.0]


def test_probe_chooses_only_among_the_test_words_own_senses() -> None:
    # `bat%animal`'s centroid equals the test vector, but a `bank` word cannot take it.
    train = np.array([[[1.0, 0.0]], [[0.6, 0.8]], [[0.0, 1.0]]])
    senses = ["bank%money", "bank%river", "bat%animal"]
    result = sense_probe(train, senses, np.array([[[0.0, 1.0]]]), ["bank%river"])
    assert result.layer_accuracies == [1.0]
    assert result.num_lemmas == 1
    assert result.num_senses == 3


def test_probe_counts_a_test_sense_unseen_in_training_as_wrong() -> None:
    train = np.array([[[1.0]], [[1.0]]])
    result = sense_probe(train, ["w%a", "w%a"], np.array([[[1.0]], [[1.0]]]), ["w%a", "w%new"])
    assert result.layer_accuracies == [0.5]
    assert result.mfs_accuracy == 0.5
    assert result.num_unseen_senses == 1


def test_probe_refuses_mismatched_inputs_and_unseen_lemmas() -> None:
    vectors = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="train vectors"):
        sense_probe(vectors, ["w%a"], vectors, ["w%a", "w%a"])
    with pytest.raises(ValueError, match=r"\(L, D\)"):
        sense_probe(vectors, ["w%a"] * 2, np.zeros((2, 3, 5)), ["w%a"] * 2)
    with pytest.raises(ValueError, match=r"\['v'\]"):
        sense_probe(vectors, ["w%a"] * 2, vectors, ["w%a", "v%a"])


def test_target_vectors_reads_each_examples_word_from_its_sentence(tmp_path: Path) -> None:
    examples = [example("w%a", "a b c", 2), example("w%b", "d e", 0), example("w%a", "f g h i", 1)]
    offsets = np.array([0, 3, 5, 9])  # (S + 1,)
    activations = np.arange(9 * 2 * 3, dtype=np.float16).reshape(9, 2, 3)  # (N, L, D)
    cached = CachedActivations(tmp_path, "key", activations, offsets)

    vectors = target_vectors(cached, examples)

    assert vectors.dtype == np.float32
    np.testing.assert_array_equal(vectors, activations[[2, 3, 6]].astype(np.float32))
    with pytest.raises(ValueError, match="in order"):
        target_vectors(cached, examples[::-1])


def test_demo_files_parse_and_every_test_lemma_has_several_trained_senses() -> None:
    train, test = read_sense_splits(DEMO / "senses.train.tsv", DEMO / "senses.test.tsv")
    senses = Counter(example.sense for example in train)
    lemmas = Counter(example.lemma for example in train)
    assert len(lemmas) >= 8
    assert {example.sense for example in test} <= set(senses)
    for lemma in lemmas:
        lemma_senses = [sense for sense in senses if sense.startswith(f"{lemma}%")]
        assert 2 <= len(lemma_senses) <= 3, lemma
    assert min(senses.values()) >= 6
    assert min(Counter(example.sense for example in test).values()) >= 3
    # The index points at the word itself, always in its base form.
    assert all(example.word == example.lemma for example in train + test)


def test_demo_probe_on_a_real_bilm_scores_the_token_layer_at_the_baseline(tmp_path: Path) -> None:
    # Every target is the same surface form, so the context-free token layer cannot beat MFS.
    torch.manual_seed(0)
    bilm = BiLM(tiny()).eval()
    train, test = read_sense_splits(DEMO / "senses.train.tsv", DEMO / "senses.test.tsv")
    cache = ActivationCache(tmp_path, dtype="float32")
    vectors = [
        target_vectors(cache.get_or_build(bilm, sense_sentences(split), progress=False), split)
        for split in (train, test)
    ]

    result = sense_probe(vectors[0], [e.sense for e in train], vectors[1], [e.sense for e in test])

    assert len(result.layer_accuracies) == tiny().lstm.num_layers + 1
    assert result.layer_accuracies[0] == result.mfs_accuracy
    assert (result.num_train, result.num_test, result.num_unseen_senses) == (175, 75, 0)
