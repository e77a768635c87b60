import pytest

from elmo_core.errors import DataError
from elmo_core.tasks.classification import read_label_text, read_tsv


def write(tmp_path, text, name="data.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_label_text_label_is_the_first_field(tmp_path):
    text = (
        "DESC:manner How did serfdom develop in and then leave Russia ?\n"
        "\n"
        "ENTY:cremat What films featured the character Popeye Doyle ?\n"
    )
    dataset = read_label_text(write(tmp_path, text))
    assert dataset[0].label == "DESC:manner"
    assert dataset[0].tokens[:3] == ["How", "did", "serfdom"]
    assert dataset[1].tokens[-1] == "?"
    assert dataset.labels() == ["DESC:manner", "ENTY:cremat"]


def test_label_text_line_without_sentence_names_the_line(tmp_path):
    path = write(tmp_path, "NUM:date When was it ?\nHUM:ind\n")
    with pytest.raises(DataError, match=r"data.txt:2: only a label \('HUM:ind'\)"):
        read_label_text(path)


def test_tsv_label_first(tmp_path):
    dataset = read_tsv(write(tmp_path, "1\ta fine film\n0\tdull , dull\n"))
    assert [(example.label, example.tokens) for example in dataset] == [
        ("1", ["a", "fine", "film"]),
        ("0", ["dull", ",", "dull"]),
    ]


def test_tsv_label_last_with_header(tmp_path):
    path = write(tmp_path, "sentence\tlabel\na fine film \t1\n")
    dataset = read_tsv(path, label_column="last", header=True)
    assert [(example.label, example.tokens) for example in dataset] == [
        ("1", ["a", "fine", "film"])
    ]
    assert dataset.skipped == {"header": 1}


def test_tsv_wrong_field_count_names_the_line(tmp_path):
    path = write(tmp_path, "1\tgood\n\n0\tbad\textra\n")
    with pytest.raises(DataError, match=r"data.txt:3: 3 tab-separated fields; expected 2"):
        read_tsv(path)


def test_tsv_empty_sentence_is_an_error(tmp_path):
    with pytest.raises(DataError, match=r"data.txt:1: empty sentence"):
        read_tsv(write(tmp_path, "1\t  \n"))


def test_header_only_tsv_is_empty(tmp_path):
    with pytest.raises(DataError, match=r"no examples in file \(skipped: 1 header\)"):
        read_tsv(write(tmp_path, "sentence\tlabel\n"), header=True)
