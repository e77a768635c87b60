import pytest

from elmo_core.errors import DataError
from elmo_core.tasks.sst import parse_tree, read_sst

TREES = """\
(3 (2 It) (4 (4 (2 's) (4 (3 (2 a) (4 lovely)) (2 film))) (2 .)))

(1 (2 Not) (1 good))
"""


def write(tmp_path, text, name="train.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_sentence_label_is_the_roots_and_tokens_are_the_leaves(tmp_path):
    dataset = read_sst(write(tmp_path, TREES))
    assert [(example.tokens, example.label) for example in dataset] == [
        (["It", "'s", "a", "lovely", "film", "."], "3"),
        (["Not", "good"], "1"),
    ]
    assert dataset.skipped == {}


def test_phrase_level_gives_every_subtree_root_first(tmp_path):
    dataset = read_sst(write(tmp_path, "(1 (2 Not) (1 good))\n"), phrases=True)
    assert [(example.tokens, example.label) for example in dataset] == [
        (["Not", "good"], "1"),
        (["Not"], "2"),
        (["good"], "1"),
    ]


def test_phrase_level_counts_all_nodes(tmp_path):
    dataset = read_sst(write(tmp_path, TREES), phrases=True)
    # tree 1: root, It, (4 ...), (4 's ...), 's, (4 (3 a lovely) film), (3 a lovely), a, lovely,
    # film, . = 11 nodes; tree 2: 3 nodes
    assert len(dataset) == 14
    assert (["a", "lovely"], "3") in [(example.tokens, example.label) for example in dataset]


def test_missing_closing_parenthesis_names_the_line(tmp_path):
    path = write(tmp_path, "(2 fine)\n(3 (2 It) (4 works)\n")
    with pytest.raises(DataError, match=r"train.txt:2: unbalanced parentheses: 1 '\(' not closed"):
        read_sst(path)


def test_extra_closing_parenthesis_names_line_and_column(tmp_path):
    path = write(tmp_path, "(2 fine))\n")
    with pytest.raises(
        DataError, match=r"train.txt:1: text after the end of the tree \(column 9\)"
    ):
        read_sst(path)
    with pytest.raises(DataError, match=r"':1: unbalanced parentheses: '\)' without"):
        parse_tree(") (2 x)", path="'", line=1)


def test_missing_label_names_the_line(tmp_path):
    path = write(tmp_path, "(2 fine)\n\n((2 It) (4 works))\n")
    with pytest.raises(DataError, match=r"train.txt:3: missing label after '\(' \(column 2\)"):
        read_sst(path)


def test_non_integer_label_and_empty_node_are_errors():
    with pytest.raises(DataError, match=r"label 'It' is not an integer"):
        parse_tree("(3 (It) (2 x))")
    with pytest.raises(DataError, match=r"node '\(2' has no children"):
        parse_tree("(3 (2) (2 x))")
    with pytest.raises(DataError, match=r"word 'It' outside"):
        parse_tree("It (2 x)")


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(DataError, match=r"train.txt: no examples in file"):
        read_sst(write(tmp_path, "\n\n"))
