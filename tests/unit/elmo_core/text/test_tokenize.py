import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from elmo_core.errors import ConfigError, DataError
from elmo_core.text import tokenize
from elmo_core.text.tokenize import (
    MOSES_LANGUAGES,
    MosesTokenizer,
    Tokenizer,
    WhitespaceTokenizer,
    split_whitespace,
)


@pytest.mark.parametrize(
    "lines",
    [
        ["  a  b\tc ", "", "   ", "x", "ü\v z\f\r"],  # ASCII whitespace only: the fast kernel
        ["a\u00a0b", "c\u3000d e", "f\x1cg", "h\u2009i", "é ü"],  # other Unicode spaces
    ],
)
def test_split_whitespace_equals_python_split(lines):
    assert split_whitespace(pa.array(lines)).to_pylist() == [line.split() for line in lines]


def test_split_whitespace_finds_each_non_ascii_space_alone_in_a_block():
    spaces = [chr(c) for c in range(0x110000) if f"a{chr(c)}b".split() == ["a", "b"]]
    for space in spaces:
        lines = ["plain ascii line", f"a{space}b"]
        assert split_whitespace(pa.array(lines)).to_pylist() == [line.split() for line in lines]


SPACES = [chr(c) for c in range(0x110000) if f"a{chr(c)}b".split() == ["a", "b"]]


def test_each_line_splits_as_python_split_for_every_space():
    lines = ["", "  ", "x\u200by ü\ufeff", *(f"é{s}b{s}" for s in SPACES if s != "\n"), "\u3000x"]
    assert split_whitespace(pa.array(lines)).to_pylist() == [line.split() for line in lines]


def test_random_text_splits_as_python_split():
    """Spaces next to look-alikes: the lead bytes of a space followed by other continuations."""
    pieces = ["a", "Zz", "é", "東京", "\u00a1", "\u2080", "\u200b", "\u1681", "\u3001", "\x00"]
    pieces += [" ", "\t", "\r", "\x1c", "\u00a0", "\u2003", "\u2029", "\u3000", "x" * 70]
    rng = random.Random(0)
    for _ in range(300):
        lines = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 24))) for _ in range(3)]
        assert split_whitespace(pa.array(lines)).to_pylist() == [line.split() for line in lines]


def test_split_tokens_are_dictionary_encoded_in_first_occurrence_order():
    words = [f"w{i % 997}é{'x' * (i % 23)}" for i in range(20_000)]
    lines = [" ".join(words[i : i + 7]) for i in range(0, len(words), 7)]
    tokens = split_whitespace(pa.array(lines)).values
    expected = pc.dictionary_encode(pa.array(words))
    assert tokens.dictionary.equals(expected.dictionary)
    assert tokens.indices.equals(expected.indices)


@pytest.mark.parametrize("threads", [2, 3])
def test_slices_split_on_threads_give_the_same_tokens_and_dictionary(threads, monkeypatch):
    monkeypatch.setattr(tokenize, "MIN_LINES_PER_THREAD", 10)
    rng = random.Random(1)
    words = [f"w{i}" for i in range(300)] + ["a\u00a0b", "x\x1cy", "é"]
    lines = [" ".join(rng.choices(words, k=rng.randint(0, 9))) for _ in range(200)]
    alone = split_whitespace(pa.array(lines), threads=1)
    together = split_whitespace(pa.array(lines), threads=threads)
    assert together.values.dictionary.equals(alone.values.dictionary)
    assert together.values.indices.equals(alone.values.indices)
    assert together.offsets.equals(alone.offsets)
    assert together.to_pylist() == [line.split() for line in lines]


def test_whitespace_tokenizer_keeps_case_and_one_sentence_per_line():
    tokenizer = WhitespaceTokenizer()
    sentences, origin = tokenizer.tokenize_lines(pa.array(["The U.S. , said", " ", "Hi ."]))
    assert sentences.to_pylist() == [["The", "U.S.", ",", "said"], ["Hi", "."]]
    assert origin.tolist() == [0, 2]  # a blank line gives no sentence
    assert tokenizer.tokenize("Hello  World") == [["Hello", "World"]]


def test_moses_splits_sentences_but_not_abbreviations():
    tokenizer = MosesTokenizer()
    text = 'Mr. Smith went to Washington. He said "Hi!" Then he left.'
    assert tokenizer.tokenize(text) == [
        ["Mr.", "Smith", "went", "to", "Washington", "."],
        ["He", "said", '"', "Hi", "!", '"'],
        ["Then", "he", "left", "."],
    ]


def test_moses_tokenize_lines_records_the_line_of_each_sentence():
    sentences, origin = MosesTokenizer().tokenize_lines(pa.array(["One. Two.", "Three"]))
    assert sentences.to_pylist() == [["One", "."], ["Two", "."], ["Three"]]
    assert origin.tolist() == [0, 0, 1]


@pytest.mark.parametrize(
    "tokenizer", [WhitespaceTokenizer(), MosesTokenizer(lang="en"), MosesTokenizer(lang="de")]
)
def test_describe_and_from_manifest_round_trip(tokenizer):
    rebuilt = Tokenizer.from_manifest(tokenizer.describe())
    assert type(rebuilt) is type(tokenizer)
    assert rebuilt.describe() == tokenizer.describe()
    text = "It costs $5.00, isn't it? Yes."
    assert rebuilt.tokenize(text) == tokenizer.tokenize(text)


def test_unknown_tokenizer_in_a_manifest_is_a_data_error():
    with pytest.raises(DataError, match="unknown tokenizer 'bpe'"):
        Tokenizer.from_manifest({"name": "bpe"})


def test_a_description_without_a_language_is_english_moses():
    """Manifests written before the language was configurable still load, as English."""
    old = {"name": "moses", "escape": False, "aggressive_dash_splits": False, "version": "0.1.1"}
    rebuilt = Tokenizer.from_manifest(old)
    assert isinstance(rebuilt, MosesTokenizer) and rebuilt.lang == "en"
    assert rebuilt.tokenize("Mr. Smith isn't here.") == [["Mr.", "Smith", "isn", "'t", "here", "."]]


def test_the_language_is_recorded_in_the_description():
    assert MosesTokenizer(lang="de").describe()["lang"] == "de"


@pytest.mark.parametrize(
    ("corpus_format", "expected"),
    [
        ("text", MosesTokenizer),
        ("tokenized", WhitespaceTokenizer),
        ("1b-benchmark", WhitespaceTokenizer),
    ],
)
def test_each_format_gets_its_tokenizer(corpus_format, expected):
    tokenizer = Tokenizer.for_format(corpus_format, "de")
    assert type(tokenizer) is expected
    assert getattr(tokenizer, "lang", "de") == "de"


def test_german_moses_tokenizes_by_the_german_rules():
    """Moses splits an apostrophe off both sides outside English, where "'s" is a clitic."""
    text = "Wie geht's dir? Das ist z.B. ein Test für 3,50 €."
    assert MosesTokenizer(lang="de").tokenize(text) == [
        ["Wie", "geht", "'", "s", "dir", "?"],
        ["Das", "ist", "z.B.", "ein", "Test", "für", "3,50", "€", "."],
    ]
    assert MosesTokenizer(lang="en").tokenize(text)[0] == ["Wie", "geht", "'s", "dir", "?"]


def test_german_nonbreaking_prefixes_keep_sentences_together():
    text = "Wir treffen uns z.B. Montag. Es gilt für Kinder bzw. Jugendliche. Er kommt ca. 8 Uhr."
    assert MosesTokenizer(lang="de").split_sentences(text) == [
        "Wir treffen uns z.B. Montag.",
        "Es gilt für Kinder bzw. Jugendliche.",
        "Er kommt ca. 8 Uhr.",
    ]
    assert len(MosesTokenizer(lang="en").split_sentences(text)) == 6  # none is English


@pytest.mark.parametrize(
    ("lang", "text", "expected"),
    [
        ("de", "Es regnet. „Wirklich?“ Überall.", ["Es regnet.", "„Wirklich?“", "Überall."]),
        ("pl", "To jest dom. Łódź jest duża.", ["To jest dom.", "Łódź jest duża."]),
        ("ru", "Он пришёл. Она ушла. и всё.", ["Он пришёл.", "Она ушла. и всё."]),
        ("el", "Καλημέρα. Ευχαριστώ.", ["Καλημέρα.", "Ευχαριστώ."]),
    ],
)
def test_sentences_start_with_an_upper_case_letter_of_any_script(lang, text, expected):
    assert MosesTokenizer(lang=lang).split_sentences(text) == expected


@pytest.mark.parametrize("lang", ["xx", "german", "EN", ""])
def test_an_unknown_language_is_refused_naming_tokenizer_lang(lang):
    """sacremoses would silently use the English prefixes for a language it does not know."""
    with pytest.raises(ConfigError, match="unknown language") as err:
        MosesTokenizer(lang=lang)
    assert err.value.key == "tokenizer.lang" and "tokenizer.lang" in str(err.value)
    assert "de" in str(err.value)  # the languages there are


def test_the_languages_are_those_sacremoses_ships_nonbreaking_prefixes_for():
    from sacremoses import NonbreakingPrefixes

    assert set(NonbreakingPrefixes().available_langs.values()) == MOSES_LANGUAGES
