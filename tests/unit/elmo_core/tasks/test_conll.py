import pytest

from elmo_core.errors import DataError
from elmo_core.tasks.conll import read_conll2003, read_conllu

CONLL_4_COLUMNS = """\
-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP I-NP I-LOC
1996-08-22 CD I-NP O
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_conll2003_four_columns_skips_docstart_and_splits_on_blank_lines(tmp_path):
    dataset = read_conll2003(write(tmp_path, "eng.train", CONLL_4_COLUMNS))
    assert [example.tokens for example in dataset] == [
        ["EU", "rejects", "German", "call", "."],
        ["Peter", "Blackburn"],
        ["BRUSSELS", "1996-08-22"],
    ]
    assert dataset[0].tags == ["I-ORG", "O", "I-MISC", "O", "O"]
    assert dataset.skipped == {"docstart": 2}
    assert dataset.labels() == ["I-LOC", "I-MISC", "I-ORG", "I-PER", "O"]


def test_conll2003_two_columns_without_final_blank_line_or_docstart_separator(tmp_path):
    text = "-DOCSTART- O\nJohn B-PER\nlives O\nin O\nNew B-LOC\nYork I-LOC\n\nHi O"
    dataset = read_conll2003(write(tmp_path, "two.txt", text), tag_scheme="iob2")
    assert [example.tags for example in dataset] == [
        ["B-PER", "O", "O", "B-LOC", "I-LOC"],
        ["O"],
    ]
    assert dataset.skipped == {"docstart": 1}


def test_conll2003_docstart_without_blank_line_still_ends_the_sentence(tmp_path):
    text = "A O\n-DOCSTART- O\nB O\n"
    dataset = read_conll2003(write(tmp_path, "d.txt", text))
    assert [example.tokens for example in dataset] == [["A"], ["B"]]


def test_conll2003_wrong_column_count_names_the_line(tmp_path):
    path = write(tmp_path, "bad.txt", "EU NNP I-NP I-ORG\nrejects VBZ O\n")
    with pytest.raises(DataError, match=r"bad.txt:2: 3 columns") as caught:
        read_conll2003(path)
    assert caught.value.line == 2
    assert caught.value.path == str(path)


def test_conll2003_mixed_column_counts_are_an_error(tmp_path):
    path = write(tmp_path, "mixed.txt", "EU NNP I-NP I-ORG\n\nrejects O\n")
    with pytest.raises(DataError, match=r"mixed.txt:3: 2 columns where earlier lines have 4"):
        read_conll2003(path)


def test_conll2003_checks_tag_shape_unless_scheme_is_none(tmp_path):
    path = write(tmp_path, "tags.txt", "EU ORG\n")
    with pytest.raises(DataError, match=r"tags.txt:1: tag 'ORG' is not O, B-TYPE or I-TYPE"):
        read_conll2003(path)
    assert read_conll2003(path, tag_scheme="none")[0].tags == ["ORG"]


def test_conll2003_empty_or_docstart_only_file_is_an_error(tmp_path):
    with pytest.raises(DataError, match=r"empty.txt: no examples in file$"):
        read_conll2003(write(tmp_path, "empty.txt", ""))
    with pytest.raises(DataError, match=r"no examples in file \(skipped: 1 docstart\)"):
        read_conll2003(write(tmp_path, "doc.txt", "-DOCSTART- -X- -X- O\n\n"))


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"nothere.txt: file not found"):
        read_conll2003(tmp_path / "nothere.txt")


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("EU I-ORG\nKöln I-LOC\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt:2: invalid UTF-8"):
        read_conll2003(path)


def test_conllu_skips_comments_multiword_tokens_and_empty_nodes(tmp_path, spanish_conllu):
    dataset = read_conllu(write(tmp_path, "es.conllu", spanish_conllu))
    assert [example.tokens for example in dataset] == [
        ["Vamos", "nos", "a", "el", "mar", "."],
        ["Sí"],
    ]
    assert dataset[0].tags == ["VERB", "PRON", "ADP", "DET", "NOUN", "PUNCT"]
    assert dataset.skipped == {"multiword_token": 2, "empty_node": 1}


def test_conllu_reads_xpos_by_option(tmp_path, spanish_conllu):
    dataset = read_conllu(write(tmp_path, "es.conllu", spanish_conllu), column="xpos")
    assert dataset[0].tags == ["VMM", "PP", "SPS", "DA", "NC", "Fp"]
    assert dataset[1].tags == ["RG"]


def test_conllu_keeps_spaces_inside_a_form(tmp_path):
    text = "1\t10 000\t10 000\tNUM\tCD\t_\t0\troot\t_\t_\n"
    assert read_conllu(write(tmp_path, "sp.conllu", text))[0].tokens == ["10 000"]


def test_conllu_wrong_column_count_names_the_line(tmp_path, spanish_conllu):
    lines = spanish_conllu.splitlines()
    lines[5] = "4 el el DET DA _ 5 det _ _"  # spaces instead of tabs: one column
    path = write(tmp_path, "bad.conllu", "\n".join(lines) + "\n")
    with pytest.raises(
        DataError, match=r"bad.conllu:6: 1 tab-separated columns; CoNLL-U requires 10"
    ):
        read_conllu(path)


def test_conllu_unspecified_tag_is_an_error(tmp_path):
    path = write(tmp_path, "noxpos.conllu", "1\tSí\tsí\tINTJ\t_\t_\t0\troot\t_\t_\n")
    with pytest.raises(DataError, match=r"noxpos.conllu:1: word 1 has no XPOS"):
        read_conllu(path, column="xpos")


def test_conllu_non_integer_id_is_an_error(tmp_path):
    path = write(tmp_path, "id.conllu", "x\tSí\tsí\tINTJ\tRG\t_\t0\troot\t_\t_\n")
    with pytest.raises(DataError, match=r"id.conllu:1: word id 'x' is not an integer"):
        read_conllu(path)


def test_conllu_file_of_comments_only_is_empty(tmp_path):
    with pytest.raises(DataError, match="no examples"):
        read_conllu(write(tmp_path, "c.conllu", "# just a comment\n\n"))
