import types

import pytest
import torch
from torch import nn

from elmo_core.model.bilm import BiLMOutput
from elmo_core.model.elmo import Elmo, remove_sentence_boundaries
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids

SENTENCES = [["The", "cat", "sat", "."], ["Dogs", "bark"], ["Hi"]]


class FakeBiLM(nn.Module):
    """The BiLM forward contract as a deterministic function of char ids (one scale per layer).

    Position values: ``<S>`` is -1, ``</S>`` is -2, a real token is the sum of its char ids; layer
    ``k`` is ``(k + 1) · value · scale`` in every one of its ``2P`` columns. Padding is zero.
    """

    def __init__(self, num_lstm_layers: int = 2, projection_dim: int = 3) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(lstm=types.SimpleNamespace(num_layers=num_lstm_layers))
        self.width = 2 * projection_dim
        self.scale = nn.Parameter(torch.ones(num_lstm_layers + 1))
        self.calls_in_training_mode: list[bool] = []

    def forward(self, char_ids: torch.Tensor, state=None) -> BiLMOutput:
        self.calls_in_training_mode.append(self.training)
        batch_size, num_tokens, _ = char_ids.shape
        values = char_ids.float().sum(-1)  # (B, T)
        lengths = (char_ids != 0).any(-1).sum(1)  # (B,)
        padded = torch.zeros(batch_size, num_tokens + 2)  # (B, T+2)
        padded[:, 1:-1] = values
        positions = torch.arange(num_tokens + 2)
        padded[:, 0] = -1.0
        padded = torch.where(positions == (lengths + 1).unsqueeze(1), -2.0, padded)
        mask = positions < (lengths + 2).unsqueeze(1)  # (B, T+2)
        padded = padded * mask
        activations = [
            (k + 1) * self.scale[k] * padded.unsqueeze(-1).expand(-1, -1, self.width)
            for k in range(len(self.scale))
        ]
        return BiLMOutput(activations, mask, state=None)


def _char_ids() -> torch.Tensor:
    return batch_to_ids(SENTENCES)  # (3, 4, 50)


def test_remove_sentence_boundaries_handles_rows_of_different_lengths():
    # Rows with 3, 1 and 0 real tokens (lengths with markers 5, 3, 2); width 1.
    values = torch.tensor(
        [[-1.0, 1, 2, 3, -2], [-1.0, 7, -2, 0, 0], [-1.0, -2, 0, 0, 0]]
    ).unsqueeze(-1)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]).bool()
    stripped, new_mask = remove_sentence_boundaries(values, mask)
    assert stripped.shape == (3, 3, 1) and new_mask.shape == (3, 3)
    assert stripped.squeeze(-1).tolist() == [[1, 2, 3], [7, 0, 0], [0, 0, 0]]
    assert new_mask.tolist() == [[True] * 3, [True, False, False], [False] * 3]


def test_outputs_are_the_mean_of_layers_without_boundaries_at_init():
    elmo = Elmo(FakeBiLM(), num_output_representations=2, dropout=0.0)
    char_ids = _char_ids()
    output = elmo(char_ids)
    assert len(output["elmo_representations"]) == 2
    expected_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]).bool()
    assert torch.equal(output["mask"], expected_mask)
    values = char_ids.float().sum(-1) * expected_mask  # (B, T)
    expected = (values * (1 + 2 + 3) / 3).unsqueeze(-1).expand(-1, -1, 6)  # mean of 3 layers
    for representation in output["elmo_representations"]:
        assert representation.shape == (3, 4, 6)
        torch.testing.assert_close(representation, expected)


def test_keep_sentence_boundaries_returns_the_markers():
    elmo = Elmo(FakeBiLM(), 1, dropout=0.0, keep_sentence_boundaries=True)
    output = elmo(_char_ids())
    (representation,) = output["elmo_representations"]
    assert representation.shape == (3, 6, 6) and output["mask"].shape == (3, 6)
    assert output["mask"].sum(1).tolist() == [6, 4, 3]
    assert representation[0, 0, 0].item() == pytest.approx(-2.0)  # <S>: -1 · mean(1, 2, 3)
    assert representation[1, 3, 0].item() == pytest.approx(-4.0)  # </S> after two tokens
    assert (representation[2, 3:] == 0).all()


def test_each_representation_has_its_own_scalar_mix():
    elmo = Elmo(FakeBiLM(), 2, dropout=0.0)
    with torch.no_grad():
        elmo.scalar_mixes[1].scalar_parameters.copy_(torch.tensor([0.0, 0.0, 50.0]))
    first, second = elmo(_char_ids())["elmo_representations"]
    torch.testing.assert_close(second, 1.5 * first, rtol=1e-4, atol=1e-4)  # top layer only: ×3/2


def test_frozen_bilm_runs_in_eval_mode_without_gradients_while_mixes_train():
    bilm = FakeBiLM()
    elmo = Elmo(bilm, 1).train()
    assert elmo.training and not bilm.training
    (representation,) = elmo(_char_ids())["elmo_representations"]
    assert bilm.calls_in_training_mode == [False]
    representation.sum().backward()
    assert bilm.scale.grad is None and not bilm.scale.requires_grad
    assert elmo.scalar_mixes[0].scalar_parameters.grad is not None
    assert elmo.scalar_mixes[0].gamma.grad is not None


def test_requires_grad_fine_tunes_the_bilm():
    bilm = FakeBiLM()
    elmo = Elmo(bilm, 1, dropout=0.0, requires_grad=True).train()
    assert bilm.training
    elmo(_char_ids())["elmo_representations"][0].sum().backward()
    assert bilm.scale.grad is not None and bilm.scale.grad.abs().sum() > 0


def test_dropout_follows_the_mix_in_training_only():
    elmo = Elmo(FakeBiLM(), 1, dropout=0.5)
    torch.manual_seed(0)
    dropped = elmo.train()(_char_ids())["elmo_representations"][0]
    clean = elmo.eval()(_char_ids())["elmo_representations"][0]
    real = clean != 0
    kept = dropped[real] != 0
    assert 0 < kept.sum() < real.sum()
    torch.testing.assert_close(dropped[real][kept], 2 * clean[real][kept])


def test_fixed_scalar_mix_parameters_are_used_and_not_trained():
    elmo = Elmo(FakeBiLM(), 1, dropout=0.0, scalar_mix_parameters=[-9e9, -9e9, 0.0])
    assert not any(p.requires_grad for p in elmo.scalar_mixes.parameters())
    (representation,) = elmo(_char_ids())["elmo_representations"]
    values = _char_ids().float().sum(-1)
    torch.testing.assert_close(representation[0, :, 0], 3 * values[0])


def test_layer_norm_excludes_boundaries_and_padding():
    elmo = Elmo(FakeBiLM(), 1, dropout=0.0, do_layer_norm=True)
    output = elmo(_char_ids())
    (representation,) = output["elmo_representations"]
    real = representation[output["mask"]]  # (positions, 2P)
    # Every layer is a multiple of the same values, so all normalise to the same thing.
    assert real.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert real.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)


def test_with_the_real_tiny_bilm():
    from elmo_core.model.bilm import BiLM

    torch.manual_seed(0)
    bilm = BiLM(tiny())
    elmo = Elmo(bilm, 2, dropout=0.0).train()
    char_ids = _char_ids()
    output = elmo(char_ids)
    width = 2 * tiny().lstm.projection_dim
    assert [r.shape for r in output["elmo_representations"]] == [(3, 4, width)] * 2
    assert output["mask"].sum(1).tolist() == [4, 2, 1]
    first = output["elmo_representations"][0]
    assert (first[~output["mask"]] == 0).all()
    # Stateless and frozen: the same sentence gives the same vectors, alone or in a batch.
    alone = elmo(batch_to_ids([SENTENCES[1]]))["elmo_representations"][0]
    torch.testing.assert_close(alone[0, :2], first[1, :2], rtol=1e-5, atol=1e-5)
    # The mix is the mean of the biLM's layers with the boundaries stripped.
    with torch.no_grad():
        activations = bilm(char_ids).activations
    mean = torch.stack(activations).mean(0)[:, 1:-1]  # (B, T, 2P)
    torch.testing.assert_close(first[0], mean[0], rtol=1e-5, atol=1e-5)
    first.sum().backward()
    assert all(p.grad is None for p in bilm.parameters())
