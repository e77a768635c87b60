import numpy as np
import pytest

from elmo_core.tasks.metrics import (
    accuracy,
    confusion_matrix,
    label_scores,
    span_f1,
    tags_to_spans,
)

LABELS = ("neg", "neu", "other", "pos")


def test_iob1_i_opens_entities_and_b_separates_adjacent_same_type():
    tags = ["I-PER", "I-PER", "B-PER", "O", "I-LOC"]
    assert tags_to_spans(tags, "iob1") == {("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5)}


def test_iob1_type_change_starts_a_new_entity():
    assert tags_to_spans(["I-ORG", "I-LOC", "I-LOC"], "iob1") == {("ORG", 0, 1), ("LOC", 1, 3)}


def test_iob2_adjacent_same_type_and_entity_at_sentence_end():
    tags = ["O", "B-PER", "I-PER", "B-PER"]
    assert tags_to_spans(tags, "iob2") == {("PER", 1, 3), ("PER", 3, 4)}


def test_iob2_stray_i_after_o_starts_a_span_as_in_conlleval():
    assert tags_to_spans(["O", "I-LOC", "I-LOC", "O"], "iob2") == {("LOC", 1, 3)}
    assert tags_to_spans(["B-PER", "I-LOC"], "iob2") == {("PER", 0, 1), ("LOC", 1, 2)}


def test_iob1_and_its_iob2_conversion_give_the_same_spans():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-MISC"]
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-MISC"]
    assert tags_to_spans(iob1, "iob1") == tags_to_spans(iob2, "iob2")


def test_no_entities_and_bad_input():
    assert tags_to_spans([], "iob2") == set()
    assert tags_to_spans(["O", "O"], "iob1") == set()
    with pytest.raises(ValueError, match=r"tag 'PER' at position 1"):
        tags_to_spans(["O", "PER"], "iob2")
    with pytest.raises(ValueError, match=r"tag 'B-' at position 0"):
        tags_to_spans(["B-"], "iob2")
    with pytest.raises(ValueError, match="span scheme"):
        tags_to_spans(["O"], "none")  # type: ignore[arg-type]


def test_span_f1_hand_computed():
    gold = [
        ["B-PER", "I-PER", "O", "B-LOC"],  # PER(0,2) LOC(3,4)
        ["B-ORG", "I-ORG", "I-ORG", "O", "B-PER"],  # ORG(0,3) PER(4,5)
        ["O", "O"],  # none
    ]
    predicted = [
        ["B-PER", "I-PER", "O", "B-ORG"],  # PER(0,2) correct; ORG(3,4) wrong type
        ["B-ORG", "I-ORG", "O", "O", "B-PER"],  # ORG(0,2) wrong end; PER(4,5) correct
        ["B-MISC", "O"],  # MISC(0,1) spurious
    ]
    # 4 gold, 5 predicted, 2 correct: P = 2/5 = 0.4, R = 2/4 = 0.5,
    # F1 = 2PR/(P+R) = 0.4/0.9 = 4/9.
    result = span_f1(gold, predicted, "iob2")
    assert (result.num_gold, result.num_predicted, result.num_correct) == (4, 5, 2)
    assert result.precision == pytest.approx(0.4)
    assert result.recall == pytest.approx(0.5)
    assert result.f1 == pytest.approx(4 / 9)
    # per type: PER 2/2/2 -> 1.0; LOC 1 gold 0 predicted -> 0; ORG 1 gold 2 predicted 0 correct;
    # MISC 0 gold 1 predicted.
    assert set(result.per_type) == {"PER", "LOC", "ORG", "MISC"}
    assert result.per_type["PER"].f1 == 1.0
    assert (result.per_type["LOC"].precision, result.per_type["LOC"].recall) == (0.0, 0.0)
    org = result.per_type["ORG"]
    assert (org.num_gold, org.num_predicted, org.num_correct, org.f1) == (1, 2, 0, 0.0)
    assert result.per_type["MISC"].num_predicted == 1
    metrics = result.to_metrics("test_")
    assert metrics["test_f1"] == pytest.approx(4 / 9)
    assert metrics["test_f1.PER"] == 1.0


def test_span_f1_iob1_adjacent_entities_must_be_split():
    gold = [["I-PER", "B-PER", "O", "I-ORG"]]  # PER(0,1) PER(1,2) ORG(3,4)
    merged = [["I-PER", "I-PER", "O", "I-ORG"]]  # PER(0,2) ORG(3,4)
    # 3 gold, 2 predicted, 1 correct (ORG): P = 1/2, R = 1/3, F1 = (1/3)/(5/6) = 2/5
    result = span_f1(gold, merged, "iob1")
    assert (result.precision, result.recall) == pytest.approx((1 / 2, 1 / 3))
    assert result.f1 == pytest.approx(2 / 5)
    assert span_f1(gold, gold, "iob1").f1 == 1.0


def test_span_f1_entities_do_not_run_across_sentences():
    gold = [["O", "B-PER"], ["I-PER", "O"]]  # PER(0:1,2) and a stray-I PER(1:0,1)
    predicted = [["O", "B-PER"], ["O", "O"]]
    result = span_f1(gold, predicted, "iob2")
    assert (result.num_gold, result.num_correct) == (2, 1)


def test_span_f1_without_any_entities_is_zero_and_lengths_must_match():
    assert span_f1([["O"]], [["O"]]).f1 == 0.0
    with pytest.raises(ValueError, match="1 gold sentences but 2 predicted"):
        span_f1([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        span_f1([["O", "O"]], [["O"]])


def test_accuracy_of_labels_and_of_tag_sequences():
    assert accuracy(["a", "b", "a", "c"], ["a", "b", "c", "c"]) == 0.75
    assert accuracy([["NOUN", "VERB"], ["DET"]], [["NOUN", "NOUN"], ["DET"]]) == pytest.approx(
        2 / 3
    )
    assert accuracy([0, 1, 1], [0, 1, 0]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="sentence 1: 1 gold tags but 2 predicted"):
        accuracy([["A"], ["B"]], [["A"], ["B", "C"]])
    with pytest.raises(ValueError, match="2 gold items but 1 predicted"):
        accuracy(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="undefined"):
        accuracy([], [])


def test_confusion_matrix_rows_are_gold_and_columns_predicted_in_label_order():
    gold = ["pos", "pos", "neg", "neu", "pos"]
    predicted = ["pos", "neg", "neg", "pos", "pos"]
    matrix = confusion_matrix(gold, predicted, ["neg", "neu", "pos"])
    np.testing.assert_array_equal(matrix, [[1, 0, 0], [0, 0, 1], [1, 0, 2]])
    assert np.trace(matrix) / matrix.sum() == accuracy(gold, predicted)


def test_confusion_matrix_counts_tokens_of_tag_sequences_and_refuses_unknown_labels():
    gold = [["NOUN", "VERB"], ["DET"]]
    predicted = [["NOUN", "NOUN"], ["DET"]]
    matrix = confusion_matrix(gold, predicted, ["DET", "NOUN", "VERB"])
    np.testing.assert_array_equal(matrix, [[1, 0, 0], [0, 1, 0], [0, 1, 0]])
    with pytest.raises(ValueError, match=r"labels \['ADJ'\] are not in"):
        confusion_matrix(["ADJ"], ["DET"], ["DET"])
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        confusion_matrix([["A", "B"]], [["A"]], ["A", "B"])


def test_label_scores_hand_computed_from_the_matrix():
    # gold pos 3 (2 right, 1 as neg), gold neg 1 (right), gold neu 1 (as pos); neu never predicted
    matrix = confusion_matrix(
        ["pos", "pos", "pos", "neg", "neu"], ["pos", "pos", "neg", "neg", "pos"], LABELS
    )
    scores = label_scores(matrix, [*LABELS])
    pos, neg, neu = scores["pos"], scores["neg"], scores["neu"]
    # pos: 3 gold, 3 predicted, 2 correct -> P = R = F1 = 2/3
    assert (pos.num_gold, pos.num_predicted, pos.num_correct) == (3, 3, 2)
    assert pos.f1 == pytest.approx(2 / 3)
    # neg: 1 gold, 2 predicted, 1 correct -> P = 1/2, R = 1, F1 = 2/3
    assert (neg.precision, neg.recall, neg.f1) == pytest.approx((1 / 2, 1.0, 2 / 3))
    assert (neu.num_gold, neu.num_predicted, neu.f1) == (1, 0, 0.0)
    assert "other" not in scores  # neither gold nor predicted: no score


def _conlleval_spans(tags):
    """Independent reference: conlleval.pl's endOfChunk/startOfChunk, transcribed literally.

    A sentence is bracketed by ``O`` (conlleval resets to ``O`` at blank lines).
    """

    def split(tag):
        return (tag, "") if tag == "O" else tuple(tag.split("-", 1))

    def end_of_chunk(prev_tag, tag, prev_type, kind):
        pairs = {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O")}
        return (prev_tag, tag) in pairs or (prev_tag != "O" and prev_type != kind)

    def start_of_chunk(prev_tag, tag, prev_type, kind):
        pairs = {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I")}
        return (prev_tag, tag) in pairs or (tag != "O" and prev_type != kind)

    spans, start = set(), None
    prev_tag, prev_type = "O", ""
    for index, tag in enumerate([*tags, "O"]):
        prefix, kind = split(tag)
        if start is not None and end_of_chunk(prev_tag, prefix, prev_type, kind):
            spans.add((prev_type, start, index))
            start = None
        if start_of_chunk(prev_tag, prefix, prev_type, kind):
            start = index
        prev_tag, prev_type = prefix, kind
    return spans


def test_tags_to_spans_matches_conlleval_on_random_sequences():
    import random

    rng = random.Random(0)
    alphabet = ["O", "B-A", "I-A", "B-B", "I-B"]
    for _ in range(2000):
        tags = [rng.choice(alphabet) for _ in range(rng.randint(0, 8))]
        expected = _conlleval_spans(tags)
        assert tags_to_spans(tags, "iob1") == expected, tags
        assert tags_to_spans(tags, "iob2") == expected, tags


def test_span_f1_over_label_ids_matches_the_per_sentence_sets_on_random_tags():
    """The array reading of a whole split counts the spans that :func:`tags_to_spans` finds in
    each sentence alone: none runs across a sentence boundary, every type is counted apart."""
    rng = np.random.default_rng(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]
    for scheme in ("iob1", "iob2"):
        gold = [list(rng.choice(tags, size=rng.integers(0, 9))) for _ in range(60)]
        predicted = [
            [tag if rng.random() < 0.7 else str(rng.choice(tags)) for tag in sentence]
            for sentence in gold
        ]
        counts: dict[str, list[int]] = {}
        for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
            found = tags_to_spans(gold_tags, scheme), tags_to_spans(predicted_tags, scheme)
            for column, spans in enumerate((*found, found[0] & found[1])):
                for kind, _, _ in spans:
                    counts.setdefault(kind, [0, 0, 0])[column] += 1
        result = span_f1(gold, predicted, scheme)
        assert {kind: [s.num_gold, s.num_predicted, s.num_correct] for kind, s in
                result.per_type.items()} == counts  # fmt: skip
        totals = [sum(column) for column in zip(*counts.values(), strict=True)]
        assert [result.num_gold, result.num_predicted, result.num_correct] == totals


def test_span_f1_names_a_bad_tag_by_its_position_in_its_sentence():
    with pytest.raises(ValueError, match=r"tag 'PER' at position 1"):
        span_f1([["O"], ["B-LOC", "PER"]], [["O"], ["O", "O"]])


def test_predicted_entities_where_gold_has_none_score_zero_not_a_perfect_recall():
    result = span_f1([["O", "O"]], [["B-PER", "O"]])
    assert (result.precision, result.recall, result.f1) == (0.0, 0.0, 0.0)
    assert (result.num_gold, result.num_predicted, result.num_correct) == (0, 1, 0)


def test_a_type_may_hold_a_dash_but_the_prefix_must_be_b_or_i():
    assert tags_to_spans(["B-MISC-X", "I-MISC-X"], "iob2") == {("MISC-X", 0, 2)}
    with pytest.raises(ValueError, match=r"tag 'X-PER' at position 0"):
        tags_to_spans(["X-PER"], "iob2")


@pytest.mark.parametrize("first", ["I-A", "I-B", "I-C"])
def test_an_i_tag_of_any_type_opens_the_sentence_in_iob1(first):
    others = ["B-A", "B-B", "B-C"]  # every type known, whatever its id
    assert tags_to_spans([first, *others], "iob1") == {
        (first[2:], 0, 1),
        *((tag[2:], i, i + 1) for i, tag in enumerate(others, start=1)),
    }
