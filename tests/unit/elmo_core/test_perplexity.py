"""Perplexity: a naive token-by-token reference, protocol equivalence, counting and sums."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from elmo_core.config import ModelConfig
from elmo_core.data.batching import TokenStream, window_char_ids
from elmo_core.data.reader import iter_sentences, load_manifest, load_word_types
from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm.reference import LSTMState
from elmo_core.perplexity import PerplexitySums, evaluate_perplexity
from elmo_core.presets import tiny

TRAIN = [f"w{i % 7} w{i % 5} the " + " ".join(["x"] * (i % 4)) for i in range(30)]
HELDOUT = [f"w{i % 6} the zzz{i % 2} " + " ".join(["x"] * (i % 3)) for i in range(11)]


def _config() -> ModelConfig:
    return tiny().model_copy(update={"num_samples": 4})  # fewer candidates than the tiny vocab


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    from elmo_core.config import PrepareConfig
    from pipelines.prepare.corpus_sources import CorpusFiles
    from pipelines.prepare.stage import prepare_files

    root = tmp_path_factory.mktemp("perplexity")
    (root / "train.txt").write_text("\n".join(TRAIN) + "\n")
    (root / "held.txt").write_text("\n".join(HELDOUT) + "\n")
    corpus = CorpusFiles(str(root), "text", [root / "train.txt"], [root / "held.txt"])
    prepare_files(PrepareConfig(format="text"), corpus, str(root / "dataset"))
    return str(root / "dataset")


@pytest.fixture(scope="module")
def bilm(dataset) -> BiLM:
    torch.manual_seed(0)
    model = BiLM(_config(), load_manifest(dataset).vocab.size)
    with torch.no_grad():  # a sharper softmax than the initial one, so mistakes show
        model.softmax.weight.mul_(4.0)
        model.softmax.bias.normal_()
    return model


def _naive_nll(bilm: BiLM, dataset: str, reverse: bool) -> tuple[float, int]:
    """One row, one token at a time, full log_softmax: the definition of the test loss."""
    char_table = torch.tensor(load_word_types(dataset).char_ids, dtype=torch.long)  # (Y, W)
    lstm = bilm.backward_lstm if reverse else bilm.forward_lstm
    state, total, count = None, 0.0, 0
    bilm.eval()
    with torch.no_grad():
        embedded_types = bilm.token_encoder(char_table.unsqueeze(0))[0]  # (Y, P)
        for batch in iter_sentences(dataset, "heldout"):
            for start, end in zip(batch.offsets[:-1], batch.offsets[1:], strict=True):
                types = [0, *batch.types[start:end].tolist(), 1]  # <S> w1..wn </S>
                targets = [0, *batch.targets[start:end].tolist(), 1]
                if reverse:
                    types, targets = types[::-1], targets[::-1]
                for position in range(len(types) - 1):
                    embedded = embedded_types[types[position]].view(1, 1, -1)  # (1, 1, P)
                    outputs, state = lstm(embedded, torch.ones(1, 1, dtype=torch.bool), state)
                    logits = outputs[-1][0, 0] @ bilm.softmax.weight.T + bilm.softmax.bias
                    total -= float(torch.log_softmax(logits.double(), 0)[targets[position + 1]])
                    count += 1
    return total, count


def test_perplexity_equals_exp_mean_nll_of_a_naive_reference(bilm, dataset):
    sums = evaluate_perplexity(bilm, dataset, batch_size=1, unroll_steps=4, progress=False)
    forward_nll, count = _naive_nll(bilm, dataset, reverse=False)
    backward_nll, _ = _naive_nll(bilm, dataset, reverse=True)
    assert sums.num_tokens == count == sums.backward_tokens
    assert sums.forward_nll == pytest.approx(forward_nll, rel=1e-5)
    assert sums.backward_nll == pytest.approx(backward_nll, rel=1e-5)
    expected = math.exp((forward_nll + backward_nll) / (2 * count))
    assert sums.perplexity == pytest.approx(expected, rel=1e-5)
    assert sums.forward_perplexity != pytest.approx(sums.backward_perplexity, rel=1e-3)


def test_every_position_is_scored_including_end_markers_and_unknown_words(bilm, dataset):
    manifest = load_manifest(dataset)
    heldout = manifest.split("heldout")
    assert heldout.num_oov_tokens > 0
    sums = evaluate_perplexity(bilm, dataset, batch_size=3, unroll_steps=5, progress=False)
    assert sums.num_tokens == heldout.num_tokens + heldout.num_sentences


def test_batched_windows_give_the_same_numbers_as_one_token_per_step(bilm, dataset):
    one = evaluate_perplexity(bilm, dataset, batch_size=3, unroll_steps=1, progress=False)
    seven = evaluate_perplexity(bilm, dataset, batch_size=3, unroll_steps=7, progress=False)
    assert one.num_tokens == seven.num_tokens
    assert seven.forward_nll == pytest.approx(one.forward_nll, rel=1e-6)
    assert seven.backward_nll == pytest.approx(one.backward_nll, rel=1e-6)


def test_original_protocol_stops_at_the_first_step_that_cannot_be_filled(bilm, dataset):
    stream = TokenStream(
        dataset, "heldout", batch_size=4, unroll_steps=1, shuffle=False, repeat=False
    )
    full_steps = 0
    while (window := stream.next_window()) is not None and (window.inputs >= 0).all():
        full_steps += 1
    original = evaluate_perplexity(bilm, dataset, batch_size=4, protocol="original", progress=False)
    prefix = evaluate_perplexity(
        bilm, dataset, batch_size=4, unroll_steps=1, max_windows=full_steps, progress=False
    )
    everything = evaluate_perplexity(bilm, dataset, batch_size=4, progress=False)
    assert original.num_tokens == 4 * full_steps < everything.num_tokens
    assert original.forward_nll == pytest.approx(prefix.forward_nll, rel=1e-6)
    assert original.backward_nll == pytest.approx(prefix.backward_nll, rel=1e-6)


def test_evaluation_runs_without_dropout_and_restores_the_mode(bilm, dataset):
    bilm.train()
    first = evaluate_perplexity(bilm, dataset, batch_size=2, progress=False)
    second = evaluate_perplexity(bilm, dataset, batch_size=2, progress=False)
    assert bilm.training and first == second


def test_ranks_sum_to_a_whole_split(bilm, dataset):
    parts = [
        evaluate_perplexity(bilm, dataset, rank=r, world_size=2, batch_size=2, progress=False)
        for r in range(2)
    ]
    heldout = load_manifest(dataset).split("heldout")
    assert (parts[0] + parts[1]).num_tokens == heldout.num_tokens + heldout.num_sentences


def test_configuration_errors(dataset):
    with pytest.raises(ConfigError, match="vocab_size"):
        evaluate_perplexity(BiLM(_config()), dataset, progress=False)
    with pytest.raises(ConfigError, match="one token per step"):
        model = BiLM(_config(), load_manifest(dataset).vocab.size)
        evaluate_perplexity(model, dataset, protocol="original", unroll_steps=5, progress=False)


def test_sums_add_and_average_geometrically():
    a = PerplexitySums(forward_nll=2.0, backward_nll=4.0, forward_tokens=2, backward_tokens=2)
    b = PerplexitySums(forward_nll=1.0, backward_nll=1.0, forward_tokens=1, backward_tokens=1)
    total = a + b
    assert total.num_tokens == 3
    assert total.forward_perplexity == pytest.approx(math.e)
    assert total.backward_perplexity == pytest.approx(math.exp(5 / 3))
    assert total.perplexity == pytest.approx(math.exp(0.5 * (1 + 5 / 3)))
    assert math.isnan(PerplexitySums().perplexity)
    assert np.isclose(total.perplexity**2, total.forward_perplexity * total.backward_perplexity)


def test_perplexity_scores_what_the_training_loss_scores_in_eval_mode(bilm, dataset):
    """One per-direction forward: the training loss (exact softmax in eval mode, no dropout),
    run window by window with the state carried, sums to the perplexity's NLL."""
    streams = [
        TokenStream(
            dataset,
            "heldout",
            batch_size=3,
            unroll_steps=5,
            reverse=reverse,
            shuffle=False,
            repeat=False,
        )
        for reverse in (False, True)
    ]
    char_table = load_word_types(dataset).char_ids
    bilm.eval()
    state, forward_nll, backward_nll, count = None, 0.0, 0.0, 0
    with torch.no_grad():
        while (forward := streams[0].next_window()) is not None:
            backward = streams[1].next_window()
            tensors = [
                torch.from_numpy(array)
                for window in (forward, backward)
                for array in (window_char_ids(window.inputs, char_table), window.targets)
            ]
            loss, state = bilm.training_loss(*tensors, state=state)
            forward_nll += float(loss.forward) * int(loss.num_tokens)
            backward_nll += float(loss.backward) * int(loss.num_tokens)
            count += int(loss.num_tokens)
    sums = evaluate_perplexity(bilm, dataset, batch_size=3, unroll_steps=5, progress=False)
    assert sums.num_tokens == sums.backward_tokens == count > 0
    assert sums.forward_nll == pytest.approx(forward_nll, rel=1e-6)
    assert sums.backward_nll == pytest.approx(backward_nll, rel=1e-6)


def _locking_up(bilm: BiLM) -> BiLM:
    """A copy whose forward stack's top layer adds a full step to every cell at each token: in
    three tokens all its cells sit at the clip (every gate saturated open, in any gate order)."""
    locked = copy.deepcopy(bilm)
    with torch.no_grad():
        locked.forward_lstm.layers[-1].bias.fill_(20.0)
    return locked


def test_a_locked_up_state_is_counted_per_direction_and_row(bilm, dataset):
    healthy = evaluate_perplexity(bilm, dataset, batch_size=2, unroll_steps=5, progress=False)
    trapped = evaluate_perplexity(
        _locking_up(bilm), dataset, batch_size=2, unroll_steps=5, progress=False
    )

    assert (healthy.forward_trapped, healthy.backward_trapped, healthy.num_rows) == (0, 0, 2)
    assert (trapped.forward_trapped, trapped.backward_trapped, trapped.num_rows) == (2, 0, 2)


def test_saturated_rows_are_those_with_most_cells_of_some_layer_at_the_clip():
    c = torch.zeros(2, 3, 4)  # (L, B, H)
    c[1, 0] = torch.tensor([3.0, -3.0, 3.0, 0.1])  # 3 of 4 at the clip: locked up
    c[0, 1] = torch.tensor([3.0, -3.0, 0.0, 0.0])  # half: not yet
    c[0, 2] = torch.tensor([2.9, -2.9, 2.9, 2.9])  # near, not at
    state = LSTMState(torch.zeros(2, 3, 2), c)

    assert state.saturated_rows(cell_clip=3.0).tolist() == [True, False, False]


def test_restarting_every_window_from_zero_scores_the_same_tokens_differently(bilm, dataset):
    carried = evaluate_perplexity(bilm, dataset, batch_size=2, unroll_steps=3, progress=False)
    cold = evaluate_perplexity(
        bilm, dataset, batch_size=2, unroll_steps=3, progress=False, carry_state=False
    )

    assert cold.forward_tokens == carried.forward_tokens
    assert cold.forward_nll != carried.forward_nll
    assert cold.backward_nll != carried.backward_nll


def test_sums_travel_between_ranks_as_a_list_and_back():
    sums = PerplexitySums(1.5, 2.5, 3, 4, forward_trapped=1, backward_trapped=0, num_rows=8)
    assert PerplexitySums.from_list(sums.as_list()) == sums
