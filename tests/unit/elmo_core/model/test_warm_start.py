"""The warm start: stateless inference starts after the model's own warm-up sentences."""

import torch

from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import read_bilm_dir, write_bilm_dir
from elmo_core.model.warm_start import (
    WARMUP_FILE,
    choose_warmup,
    dataset_warmup,
    warm_state,
    warm_up,
)
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids

WARMUP = [["The", "ship", "sailed", "at", "dawn", "."], ["It", "rained", "all", "day", "."]]
SENTENCE = ['"', "Hello", ",", "said", "Emma", "."]


def _bilm(**update: object) -> BiLM:
    torch.manual_seed(0)
    return BiLM(tiny().model_copy(update={"lstm_impl": "fused", **update}), vocab_size=100).eval()


def _top_layers(bilm: BiLM, sentences: list[list[str]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return bilm(batch_to_ids(sentences)).activations


def test_the_same_sentence_gives_the_same_vectors_in_any_batch_and_call():
    bilm = warm_up(_bilm(), WARMUP)
    alone = _top_layers(bilm, [SENTENCE])
    again = _top_layers(bilm, [SENTENCE])
    in_a_batch = _top_layers(
        bilm, [["A", "longer", "row", "comes", "first", "here", "."], SENTENCE]
    )
    for one, two, batched in zip(alone, again, in_a_batch, strict=True):
        assert torch.equal(one, two)
        torch.testing.assert_close(batched[1, : one.shape[1]], one[0], atol=1e-5, rtol=1e-5)


def test_rows_start_from_the_state_after_the_warmup_not_from_zero():
    cold = _bilm()
    warm = warm_up(_bilm(), WARMUP)
    expected = warm_state(cold, WARMUP)  # read from zero with the same weights
    with torch.no_grad():
        continued = warm(batch_to_ids([SENTENCE])).activations
        by_hand = cold(batch_to_ids([SENTENCE]), expected).activations
        from_zero = cold(batch_to_ids([SENTENCE])).activations
    for layer_warm, layer_hand in zip(continued, by_hand, strict=True):
        assert torch.equal(layer_warm, layer_hand)
    assert not torch.allclose(continued[-1], from_zero[-1])
    assert torch.equal(continued[0], from_zero[0])  # the token layer has no state


def test_the_warmup_is_stored_with_the_model_and_read_into_the_same_start(tmp_path):
    bilm = _bilm()
    bilm.set_start_state(None, WARMUP)  # as training saves it: sentences only
    write_bilm_dir(bilm, tmp_path / "model")
    assert (tmp_path / "model" / WARMUP_FILE).read_text().splitlines()[0] == " ".join(WARMUP[0])
    first, second = (read_bilm_dir(tmp_path / "model").eval() for _ in range(2))
    assert first.warmup == WARMUP
    for one, two in zip(
        _top_layers(first, [SENTENCE]), _top_layers(second, [SENTENCE]), strict=True
    ):
        assert torch.equal(one, two)
    assert "start_forward_h" not in first.state_dict()  # bilm-tf's weights are unchanged


def test_a_model_without_warmup_sentences_starts_from_zero_as_bilm_tf(tmp_path):
    write_bilm_dir(_bilm(), tmp_path / "model")
    loaded = read_bilm_dir(tmp_path / "model").eval()
    assert not (tmp_path / "model" / WARMUP_FILE).exists()
    assert loaded.start_state(3, torch.float32) is None
    for one, two in zip(
        _top_layers(loaded, [SENTENCE]), _top_layers(_bilm(), [SENTENCE]), strict=True
    ):
        assert torch.equal(one, two)


def test_the_warmup_skips_sentences_opening_with_a_quote_or_a_bracket_and_headings():
    sentences = [['"', "No", "."], ["(", "aside", ")", "."], ["=", "Title", "="], ["Too", "short"]]
    sentences += [["One", "two", "three", "four"], ["5", "apples", "and", "pears", "."]]
    assert choose_warmup(sentences, num_tokens=6) == [sentences[4], sentences[5]]
    assert choose_warmup(sentences, num_tokens=3) == [sentences[4]]


def test_the_dataset_warmup_is_whole_training_sentences(make_dataset):
    lines = [f"sentence number {i} is plain text here ." for i in range(30)]
    dataset = make_dataset(['" quoted first line here ."', *lines], {"held.txt": lines[:2]})
    manifest = load_manifest(dataset)
    chosen = dataset_warmup(dataset, manifest, load_word_types(dataset, manifest))
    assert chosen and all(" ".join(s) in lines for s in chosen)
    assert sum(map(len, chosen)) >= 48 > sum(map(len, chosen[:-1]))
