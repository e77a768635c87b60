"""TokenStream windows (bilm-tf batching), resumption, partitioning and the derived step count."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest

from elmo_core.config import TrainConfig
from elmo_core.data.batching import TokenStream, Window, training_steps, window_char_ids
from elmo_core.data.reader import iter_sentences, load_manifest, load_word_types
from elmo_core.errors import DataError

THREE = ["a b c", "d e", "f"]
CORPUS = [f"w{i % 7} w{i % 5} " + " ".join(["x"] * (i % 4)) for i in range(40)]


@pytest.fixture
def three(make_dataset) -> str:
    """A dataset whose heldout file holds the three sentences in source order."""
    return make_dataset(THREE, {"held.txt": THREE})


def _names(dataset: str) -> tuple[list[str], np.ndarray]:
    types = load_word_types(dataset)
    return types.tokens.to_pylist(), types.vocab_ids


def _render(window: Window, dataset: str) -> tuple[list[list[str]], list[list[str]]]:
    tokens, vocab_ids = _names(dataset)
    vocab_token = {int(v): tokens[t] for t, v in enumerate(vocab_ids)}
    inputs = [[tokens[i] if i >= 0 else "-" for i in row] for row in window.inputs]
    targets = [[vocab_token[i] if i >= 0 else "-" for i in row] for row in window.targets]
    return inputs, targets


def _eval_stream(dataset: str, **kwargs) -> TokenStream:
    return TokenStream(dataset, "heldout", shuffle=False, repeat=False, **kwargs)


def test_forward_windows_of_three_sentences_match_hand_cut(three):
    stream = _eval_stream(three, batch_size=2, unroll_steps=3)
    windows = list(stream)
    assert len(windows) == 2
    assert _render(windows[0], three) == (
        [["<S>", "a", "b"], ["<S>", "d", "e"]],
        [["a", "b", "c"], ["d", "e", "</S>"]],
    )
    assert _render(windows[1], three) == (
        [["c", "-", "-"], ["<S>", "f", "-"]],
        [["</S>", "-", "-"], ["f", "</S>", "-"]],
    )
    assert stream.next_window() is None


def test_backward_windows_read_each_sentence_reversed(three):
    windows = list(_eval_stream(three, batch_size=2, unroll_steps=3, reverse=True))
    assert _render(windows[0], three) == (
        [["</S>", "c", "b"], ["</S>", "e", "d"]],
        [["c", "b", "a"], ["e", "d", "<S>"]],
    )
    assert _render(windows[1], three) == (
        [["a", "-", "-"], ["</S>", "f", "-"]],
        [["<S>", "-", "-"], ["f", "<S>", "-"]],
    )


def test_dtypes_and_shapes(three):
    window = _eval_stream(three, batch_size=2, unroll_steps=3).next_window()
    assert window.inputs.dtype == np.int64 and window.targets.dtype == np.int64
    assert window.inputs.shape == window.targets.shape == (2, 3)
    assert window.num_tokens == 6


def _row_sentences(windows: list[Window]) -> list[list[tuple[int, ...]]]:
    """Each row's stream split back into sentences (a sentence starts at an ``<S>`` input)."""
    rows: list[list[tuple[int, ...]]] = [[] for _ in range(windows[0].inputs.shape[0])]
    for row, sentences in enumerate(rows):
        stream = np.concatenate([w.inputs[row] for w in windows])
        stream = stream[stream >= 0]
        starts = np.flatnonzero(stream == 0).tolist() + [len(stream)]
        sentences.extend(tuple(stream[s + 1 : e]) for s, e in zip(starts, starts[1:], strict=False))
    return rows


def _source_sentences(dataset: str, split: str) -> list[tuple[int, ...]]:
    """The split's sentences (type ids) in reader order."""
    return [
        tuple(batch.types[start:end])
        for batch in iter_sentences(dataset, split)
        for start, end in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
    ]


def test_rows_pull_from_one_shared_source_and_each_sentence_is_used_once(make_dataset):
    dataset = make_dataset(CORPUS, {"held.txt": CORPUS})
    rows = _row_sentences(list(_eval_stream(dataset, batch_size=3, unroll_steps=4)))
    assert all(rows), "every row gets sentences"
    source = _source_sentences(dataset, "heldout")
    assert sorted(s for row in rows for s in row) == sorted(source)
    assert rows[0][0] == source[0] and rows[1][0] == source[1] and rows[2][0] == source[2]


def test_row_assignment_does_not_depend_on_the_window_length(make_dataset):
    dataset = make_dataset(CORPUS, {"held.txt": CORPUS})
    one = _row_sentences(list(_eval_stream(dataset, batch_size=3, unroll_steps=1)))
    seven = _row_sentences(list(_eval_stream(dataset, batch_size=3, unroll_steps=7)))
    assert one == seven


def _sentences_of_one_row(stream: TokenStream, num_windows: int) -> list[tuple[int, ...]]:
    return _row_sentences([stream.next_window() for _ in range(num_windows)])[0]


def test_repeat_wraps_around_and_reshuffles_each_epoch(make_dataset):
    dataset = make_dataset(
        CORPUS, sentences_per_shard=16, sentences_per_row_group=4, heldout_fraction=0.0
    )
    train = load_manifest(dataset).split("train")
    positions = train.num_tokens + train.num_sentences
    stream = TokenStream(dataset, batch_size=1, unroll_steps=1, seed=3)
    sentences = _sentences_of_one_row(stream, 2 * positions + 1)
    first, second = (
        sentences[: train.num_sentences],
        sentences[train.num_sentences :][: train.num_sentences],
    )
    assert sorted(first) == sorted(second) and len(set(map(tuple, first))) > 1
    assert first != second
    assert first != _source_sentences(dataset, "train")


def test_different_seeds_give_different_orders(make_dataset):
    dataset = make_dataset(CORPUS, sentences_per_row_group=4, heldout_fraction=0.0)
    first = _sentences_of_one_row(TokenStream(dataset, batch_size=1, unroll_steps=5, seed=0), 30)
    other = _sentences_of_one_row(TokenStream(dataset, batch_size=1, unroll_steps=5, seed=1), 30)
    again = _sentences_of_one_row(TokenStream(dataset, batch_size=1, unroll_steps=5, seed=0), 30)
    assert first == again and first != other


def test_ranks_read_disjoint_parts_that_cover_the_split(make_dataset):
    dataset = make_dataset(CORPUS, sentences_per_row_group=3, heldout_fraction=0.0)
    parts = []
    for rank in range(3):
        stream = TokenStream(
            dataset,
            batch_size=2,
            unroll_steps=5,
            rank=rank,
            world_size=3,
            shuffle=False,
            repeat=False,
        )
        parts.append(Counter(s for row in _row_sentences(list(stream)) for s in row))
    total = parts[0] + parts[1] + parts[2]
    everything = Counter(_source_sentences(dataset, "train"))
    assert total == everything and all(sum(p.values()) for p in parts)


def test_one_row_group_feeds_two_ranks_and_a_rank_without_a_sentence_cannot_repeat(make_dataset):
    dataset = make_dataset(THREE, heldout_fraction=0.0)  # one shard, one row group
    ranks = [
        TokenStream(dataset, batch_size=1, unroll_steps=3, rank=rank, world_size=2, shuffle=False)
        for rank in range(2)
    ]
    assert all(stream.next_window().num_tokens for stream in ranks)
    with pytest.raises(DataError, match="fewer sentences than workers"):
        TokenStream(dataset, batch_size=2, unroll_steps=3, rank=3, world_size=4)
    single_pass = TokenStream(
        dataset, batch_size=2, unroll_steps=3, rank=3, world_size=4, repeat=False
    )
    assert single_pass.next_window() is None


@pytest.mark.parametrize("repeat", [True, False])
def test_resume_from_state_dict_equals_straight_through(make_dataset, repeat):
    dataset = make_dataset(
        CORPUS, sentences_per_shard=16, sentences_per_row_group=4, heldout_fraction=0.0
    )
    kwargs = dict(batch_size=3, unroll_steps=4, seed=5, reverse=True, repeat=repeat)
    straight = TokenStream(dataset, **kwargs)
    expected = [straight.next_window() for _ in range(60)]  # past the end of the first epoch
    resumed = TokenStream(dataset, **kwargs)
    before = [resumed.next_window() for _ in range(17)]
    state = pickle.loads(pickle.dumps(resumed.state_dict()))
    assert TokenStream.saved_seed(state) == 5  # what a resuming rank builds its stream with
    restarted = TokenStream(dataset, **kwargs)
    restarted.load_state_dict(state)
    after = [restarted.next_window() for _ in range(43)]
    for got, want in zip(before + after, expected, strict=True):
        if want is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got.inputs, want.inputs)
            np.testing.assert_array_equal(got.targets, want.targets)
    assert (expected[-1] is None) == (not repeat)


def test_state_of_another_stream_is_refused(three):
    state = _eval_stream(three, batch_size=2, unroll_steps=3).state_dict()
    with pytest.raises(ValueError, match="cannot resume"):
        _eval_stream(three, batch_size=3, unroll_steps=3).load_state_dict(state)


def test_window_char_ids_gathers_rows_and_zeroes_padding():
    table = np.arange(4 * 50, dtype=np.int16).reshape(4, 50) + 1  # (Y, W)
    inputs = np.array([[3, 0, -1], [1, -1, -1]])
    chars = window_char_ids(inputs, table)
    assert chars.shape == (2, 3, 50) and chars.dtype == np.int16
    np.testing.assert_array_equal(chars[0, 0], table[3])
    np.testing.assert_array_equal(chars[1, 0], table[1])
    assert not chars[0, 2].any() and not chars[1, 1:].any()


def test_training_steps_from_the_manifest_token_count(make_dataset):
    manifest = load_manifest(make_dataset(CORPUS, heldout_fraction=0.0))
    tokens = manifest.split("train").num_tokens
    cfg = TrainConfig(epochs=2.5, batch_size=4, unroll_steps=5)
    assert training_steps(manifest, cfg, 1) == int(np.ceil(tokens * 2.5 / 20))
    assert training_steps(manifest, cfg, 3) == int(np.ceil(tokens * 2.5 / 60))
    assert training_steps(manifest, cfg.model_copy(update={"max_steps": 2}), 1) == 2
    huge = TrainConfig(epochs=0.001, batch_size=128, unroll_steps=20)
    assert training_steps(manifest, huge, 8) == 1
