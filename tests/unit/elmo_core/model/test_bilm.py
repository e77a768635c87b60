import pytest
import torch

from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM, BiLMOutput, DirectionOutput
from elmo_core.model.lstm.reference import LSTMState
from elmo_core.presets import tiny
from elmo_core.text.char_ids import BOS_IDS, EOS_IDS, batch_to_ids

VOCAB = 200
P = tiny().lstm.projection_dim
SENTENCE = ["the", "cat", "sat", "down"]
LONGER = ["a", "much", "longer", "sentence", "than", "that", "one"]
SHORTER = ["hi"]


def _model(**kwargs) -> BiLM:
    """A float64 tiny biLM with every bias non-zero, so padding tokens do not encode to zero."""
    torch.manual_seed(0)
    model = BiLM(tiny(), **kwargs).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_activations_have_one_layer_per_lstm_layer_plus_the_tokens():
    out = _model()(batch_to_ids([SENTENCE, SHORTER]))
    assert len(out.activations) == tiny().lstm.num_layers + 1
    for layer in out.activations:
        assert layer.shape == (2, len(SENTENCE) + 2, 2 * P)
    expected_mask = torch.zeros(2, len(SENTENCE) + 2, dtype=torch.bool)
    expected_mask[0, :6] = True
    expected_mask[1, :3] = True
    assert torch.equal(out.mask, expected_mask)


def test_sentence_markers_are_added_around_each_rows_real_tokens():
    model = _model()
    seen = []
    encode_types = model.token_encoder.encode_types
    model.token_encoder.encode_types = lambda ids: seen.append(ids) or encode_types(ids)
    ids = batch_to_ids([SENTENCE, SHORTER, []])
    out = model(ids)
    encoded = seen[0]  # (B, T + 2, W) what the token encoder was given
    bos, eos = torch.from_numpy(BOS_IDS).long(), torch.from_numpy(EOS_IDS).long()
    assert torch.equal(encoded[0, 0], bos) and torch.equal(encoded[0, 5], eos)
    assert torch.equal(encoded[0, 1:5], ids[0])
    assert torch.equal(encoded[1, 0], bos) and torch.equal(encoded[1, 2], eos)
    assert torch.equal(encoded[1, 1], ids[1, 0])
    assert torch.all(encoded[1, 3:] == 0)
    assert torch.all(encoded[2] == 0) and not out.mask[2].any()  # an empty row stays empty
    for layer in out.activations:
        assert torch.all(layer[2] == 0)


def test_layer_zero_is_the_token_embedding_twice_and_zero_where_masked():
    model = _model()
    ids = batch_to_ids([SENTENCE, SHORTER])
    out = model(ids)
    layer0, mask = out.activations[0], out.mask
    _assert_same(layer0[..., :P], layer0[..., P:])
    words = model.token_encoder(ids[0])  # (4, P): the real tokens without markers
    _assert_same(layer0[0, 1:5, :P], words)
    assert torch.all(layer0[~mask] == 0)


def test_padding_never_changes_the_outputs_of_real_tokens():
    model = _model()
    ids = batch_to_ids([SENTENCE])
    padded = torch.cat([ids, torch.zeros(1, 3, 50, dtype=ids.dtype)], dim=1)
    plain, extra = model(ids).activations, model(padded).activations
    for short, long in zip(plain, extra, strict=True):
        _assert_same(long[:, : len(SENTENCE) + 2], short)
        assert torch.all(long[:, len(SENTENCE) + 2 :] == 0)


def test_results_do_not_depend_on_batch_composition():
    model = _model()
    alone = model(batch_to_ids([SENTENCE])).activations
    batch = model(batch_to_ids([LONGER, SENTENCE, SHORTER, []])).activations
    width = len(SENTENCE) + 2
    for single, batched in zip(alone, batch, strict=True):
        _assert_same(batched[1, :width], single[0])


def test_backward_direction_reads_the_sentence_reversed_and_is_aligned_by_position():
    model = _model()
    ids = batch_to_ids([SENTENCE])
    changed = batch_to_ids([["the", "dog", "sat", "down"]])  # token 1 → marker position 2
    before, after = model(ids).activations, model(changed).activations
    for k in (1, 2):
        forward_before, backward_before = before[k][0, :, :P], before[k][0, :, P:]
        forward_after, backward_after = after[k][0, :, :P], after[k][0, :, P:]
        _assert_same(forward_after[:2], forward_before[:2])  # <S> the: not yet read
        _assert_same(backward_after[3:], backward_before[3:])  # sat down </S>: read first
        assert not torch.allclose(forward_after[2], forward_before[2])
        assert not torch.allclose(backward_after[2], backward_before[2])

    embedded = before[0][:, :, :P]  # (1, 6, P)
    reversed_outputs, _ = model.backward_lstm(embedded.flip(1), torch.ones(1, 6, dtype=torch.bool))
    for k in (1, 2):
        _assert_same(before[k][:, :, P:], reversed_outputs[k - 1].flip(1))


def test_stateless_by_default_the_same_sentence_gives_the_same_vectors():
    model = _model()
    first = model(batch_to_ids([SENTENCE])).activations
    model(batch_to_ids([LONGER]))
    again = model(batch_to_ids([SENTENCE])).activations
    for a, b in zip(first, again, strict=True):
        _assert_same(a, b)


def test_stateful_mode_carries_states_and_reset_restores_fresh_behaviour():
    model = _model(stateful=True)
    fresh = _model()(batch_to_ids([SENTENCE])).activations[2]
    model(batch_to_ids([LONGER]))
    carried = model(batch_to_ids([SENTENCE])).activations[2]
    assert not torch.allclose(carried, fresh)
    model.reset_states()
    _assert_same(model(batch_to_ids([SENTENCE])).activations[2], fresh)


def test_stateful_mode_equals_passing_the_returned_state():
    stateful, stateless = _model(stateful=True), _model()
    first = stateless(batch_to_ids([LONGER]))
    stateful(batch_to_ids([LONGER]))
    expected = stateless(batch_to_ids([SENTENCE]), state=first.state).activations
    for a, b in zip(stateful(batch_to_ids([SENTENCE])).activations, expected, strict=True):
        _assert_same(a, b)


def test_stateful_mode_keeps_rows_outside_the_batch_and_starts_new_rows_at_zero():
    stateful, stateless = _model(stateful=True), _model()
    three = batch_to_ids([LONGER, SENTENCE, SHORTER])
    one = batch_to_ids([SHORTER])
    four = batch_to_ids([SENTENCE, SENTENCE, SENTENCE, SENTENCE])
    stateful(three)
    stateful(one)
    got = stateful(four).activations

    first_states = stateless(three).state
    second_states = stateless(one, state=_rows(first_states, [0])).state
    start = []
    for first, second in zip(first_states, second_states, strict=True):
        h = torch.zeros(first.h.shape[0], 4, first.h.shape[2], dtype=first.h.dtype)
        c = torch.zeros(first.c.shape[0], 4, first.c.shape[2], dtype=first.c.dtype)
        h[:, 0], c[:, 0] = second.h[:, 0], second.c[:, 0]
        h[:, 1:3], c[:, 1:3] = first.h[:, 1:3], first.c[:, 1:3]
        start.append(LSTMState(h, c))
    expected = stateless(four, state=(start[0], start[1])).activations
    for a, b in zip(got, expected, strict=True):
        _assert_same(a, b)


def _rows(state, rows):
    return tuple(LSTMState(s.h[:, rows], s.c[:, rows]) for s in state)


def _training_batch(generator: torch.Generator):
    sentences = [["<S>", "a", "b", "c", "</S>"], ["<S>", "hello", "world", "</S>", "<S>"]]
    inputs = batch_to_ids(sentences)  # (2, 5, 50) the markers are ordinary tokens here
    targets = torch.randint(0, VOCAB, (2, 5), generator=generator)
    return inputs, targets, inputs.flip(1), targets.flip(1)


def test_training_loss_is_finite_and_reaches_every_parameter():
    model = _model(vocab_size=VOCAB).train()
    loss, state = model.training_loss(*_training_batch(torch.Generator().manual_seed(0)))
    assert torch.isfinite(loss.forward) and torch.isfinite(loss.backward)
    assert int(loss.num_tokens) == 10
    loss.loss.backward()
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert state[0].h.shape == (tiny().lstm.num_layers, 2, P)


def test_same_seed_gives_identical_losses():
    losses = []
    for _ in range(2):
        model = _model(vocab_size=VOCAB).train()
        torch.manual_seed(123)
        loss, _ = model.training_loss(*_training_batch(torch.Generator().manual_seed(0)))
        losses.append((loss.forward.item(), loss.backward.item()))
    assert losses[0] == losses[1]


def test_unscored_targets_are_excluded_from_the_mean():
    model = _model(vocab_size=VOCAB)  # eval: exact softmax, no dropout
    inputs, targets, back_inputs, back_targets = _training_batch(torch.Generator().manual_seed(0))
    targets[1, 2:] = -1
    loss, _ = model.training_loss(inputs, targets, back_inputs, back_targets)
    assert int(loss.num_tokens) == 7

    mask = (inputs != 0).any(-1)
    outputs, _ = model.forward_lstm(model.token_encoder(inputs), mask)
    scored = targets >= 0
    expected = model.softmax.nll(outputs[-1][scored], targets[scored]).mean()
    torch.testing.assert_close(loss.forward, expected.to(loss.forward.dtype))


def test_carried_state_over_two_windows_equals_one_long_window():
    model = _model(vocab_size=VOCAB)
    inputs, targets, back_inputs, back_targets = _training_batch(torch.Generator().manual_seed(0))
    whole, _ = model.training_loss(inputs, targets, back_inputs, back_targets)
    first, state = model.training_loss(
        inputs[:, :2], targets[:, :2], back_inputs[:, :2], back_targets[:, :2]
    )
    second, _ = model.training_loss(
        inputs[:, 2:], targets[:, 2:], back_inputs[:, 2:], back_targets[:, 2:], state
    )
    for direction in ("forward", "backward"):
        combined = (2 * getattr(first, direction) + 3 * getattr(second, direction)) / 5
        torch.testing.assert_close(combined, getattr(whole, direction))


def test_forward_returns_a_typed_result_that_unpacks():
    model = _model()
    activations, mask, (forward_state, backward_state) = model(batch_to_ids([SENTENCE]))
    assert isinstance(model(batch_to_ids([SENTENCE])), BiLMOutput)
    assert len(activations) == model.num_layers and mask.shape == (1, len(SENTENCE) + 2)
    assert forward_state.h.shape == backward_state.h.shape == (tiny().lstm.num_layers, 1, P)


def test_score_window_scores_each_direction_top_layer_after_dropout():
    model = _model(vocab_size=VOCAB).train()
    inputs, targets, back_inputs, back_targets = _training_batch(torch.Generator().manual_seed(0))
    inputs[1, 3:] = 0  # padding at the end of a row
    torch.manual_seed(3)
    tops = []
    for lstm, ids in ((model.forward_lstm, inputs), (model.backward_lstm, back_inputs)):
        mask = (ids != 0).any(-1)  # (B, T)
        outputs, _ = lstm(model.token_encoder(ids), mask)
        tops.append((outputs[-1], mask))
    expected = [(model.dropout(top), mask) for top, mask in tops]

    calls = []
    for name in ("forward_lstm", "backward_lstm"):
        getattr(model, name).register_forward_hook(lambda *_, name=name: calls.append(name))

    def score(output: DirectionOutput, direction_targets: torch.Tensor) -> DirectionOutput:
        calls.append("score")
        first = calls.count("score") == 1
        assert torch.equal(direction_targets, targets if first else back_targets)
        return output

    torch.manual_seed(3)
    forward, backward, _ = model.score_window(inputs, targets, back_inputs, back_targets, score)
    assert calls == ["forward_lstm", "backward_lstm", "score", "score"]  # the draws' order
    for got, (top, mask) in zip((forward, backward), expected, strict=True):
        _assert_same(got.top, top)
        assert torch.equal(got.mask, mask) and (got.top[mask] == 0).any()  # dropout is on
    assert forward.scored(targets).sum() == 8  # two padding positions are not scored


def test_training_loss_without_a_vocabulary_is_a_config_error():
    model = _model()
    batch = _training_batch(torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="vocab_size"):
        model.training_loss(*batch)


def test_parameter_names_are_the_interop_contract():
    names = set(dict(BiLM(tiny(), vocab_size=VOCAB).named_parameters()))
    expected = {"token_encoder.char_embedding.weight", "softmax.weight", "softmax.bias"}
    for index in range(len(tiny().char_cnn.filters)):
        expected |= {f"token_encoder.convolutions.{index}.{p}" for p in ("weight", "bias")}
    for part in ("transform", "carry"):
        expected |= {f"token_encoder.highway.{part}.0.{p}" for p in ("weight", "bias")}
    expected |= {f"token_encoder.projection.{p}" for p in ("weight", "bias")}
    for direction in ("forward_lstm", "backward_lstm"):
        for layer in range(tiny().lstm.num_layers):
            expected |= {
                f"{direction}.layers.{layer}.{p}"
                for p in ("input_weight", "recurrent_weight", "bias", "projection_weight")
            }
    assert names == expected
