import pytest

from elmo_core.errors import DataError
from elmo_core.tasks.types.parsing.conllu import read_conllu_trees


def write(tmp_path, text):
    (tmp_path / "es.conllu").write_text(text, encoding="utf-8")
    return tmp_path / "es.conllu"


def test_conllu_trees_read_heads_and_relations_of_the_syntactic_words(tmp_path, spanish_conllu):
    path = write(tmp_path, spanish_conllu.replace("\tobl\t", "\tobl:arg\t"))
    dataset = read_conllu_trees(path)
    assert [example.tokens for example in dataset] == [
        ["Vamos", "nos", "a", "el", "mar", "."],
        ["Sí"],
    ]
    assert dataset[0].heads == [0, 1, 5, 5, 1, 1]
    assert dataset[0].relations == ["root", "obj", "case", "det", "obl", "punct"]
    assert read_conllu_trees(path, relations="full")[0].relations[4] == "obl:arg"
    assert dataset.skipped == {"multiword_token": 2, "empty_node": 1}


@pytest.mark.parametrize(
    ("line", "column", "value", "message"),
    [
        (5, 6, "x", r"es.conllu:5: word 2: head 'x' is not an integer"),
        (5, 6, "9", r"es.conllu:5: word 2: head 9 is outside its sentence of 6 words"),
        (5, 7, "_", r"es.conllu:5: word 2 has no DEPREL"),
        (4, 6, "2", r"es.conllu:4: the sentence has 0 words on the root"),  # and 1 ↔ 2
        (5, 6, "0", r"es.conllu:4: the sentence has 2 words on the root \(words \[1, 2\]\)"),
        (9, 6, "3", r"es.conllu:4: the sentence's heads form a cycle through word [35]"),
    ],
)
def test_conllu_trees_refuse_what_is_no_tree_naming_the_line(
    tmp_path, spanish_conllu, line, column, value, message
):
    lines = spanish_conllu.splitlines()
    fields = lines[line - 1].split("\t")
    fields[column] = value
    lines[line - 1] = "\t".join(fields)
    with pytest.raises(DataError, match=message):
        read_conllu_trees(write(tmp_path, "\n".join(lines) + "\n"))


def test_a_word_may_hang_from_the_last_word_and_none_from_itself(tmp_path):
    words = ["1\tgo\tgo\tVERB\t_\t_\t2\txcomp\t_\t_", "2\tnow\tnow\tADV\t_\t_\t0\troot\t_\t_"]
    assert read_conllu_trees(write(tmp_path, "\n".join(words) + "\n"))[0].heads == [2, 0]
    words[0] = words[0].replace("\t2\txcomp", "\t1\txcomp")
    with pytest.raises(DataError, match="cycle through word 1"):
        read_conllu_trees(write(tmp_path, "\n".join(words) + "\n"))
