"""The shared training step equals the textbook step: dense gradients, torch's clip, Adagrad."""

from __future__ import annotations

import copy

import pytest
import torch

from elmo_core.config import TrainConfig
from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM
from elmo_core.model.sampler import LogUniformSampler, touched_rows
from elmo_core.presets import tiny
from elmo_core.training.step import TrainingStep

VOCAB, ROWS, UNROLL = 500, 3, 4
RECIPE = TrainConfig(batch_size=ROWS, unroll_steps=UNROLL, clip_norm=0.5)  # a clip that bites


def _windows(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = tiny().char_cnn.max_chars_per_token
    return {
        f"{name}_{part}": (
            torch.randint(1, 262, (ROWS, UNROLL, width), generator=generator)
            if part == "inputs"
            else torch.randint(0, VOCAB, (ROWS, UNROLL), generator=generator)
        )
        for name in ("forward", "backward")
        for part in ("inputs", "targets")
    }


def _textbook_step(bilm: BiLM, optimizer: torch.optim.Optimizer, windows, state):
    output, new_state = bilm.training_loss(**windows, state=state)
    (output.loss * UNROLL).backward()
    norm = torch.nn.utils.clip_grad_norm_(bilm.parameters(), RECIPE.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return output, (new_state[0].detach(), new_state[1].detach()), float(norm)


@pytest.mark.parametrize("grad_exchange", ["sparse", "dense"])
def test_two_steps_equal_dense_gradients_clipped_and_adagrad(grad_exchange) -> None:
    torch.manual_seed(0)
    ours = BiLM(tiny(), vocab_size=VOCAB).train()
    reference = copy.deepcopy(ours)
    step = TrainingStep.build(ours, RECIPE, grad_exchange)
    optimizer = torch.optim.Adagrad(
        reference.parameters(), lr=RECIPE.lr, initial_accumulator_value=RECIPE.initial_accumulator
    )
    state = reference_state = None
    for seed in (1, 2):  # the second step starts from the carried LSTM states
        windows = _windows(seed)
        torch.manual_seed(seed)  # the same dropout masks and sampled candidates on both sides
        result = step(**windows, state=state)
        torch.manual_seed(seed)
        output, reference_state, norm = _textbook_step(
            reference, optimizer, windows, reference_state
        )
        state = result.state
        assert result.output.loss.item() == pytest.approx(output.loss.item(), rel=1e-6)
        assert float(result.grad_norm) == pytest.approx(norm, rel=1e-5)
        assert norm > RECIPE.clip_norm
        assert not any(tensor.requires_grad for tensor in result.state[0] + result.state[1])
    for (name, ours_param), reference_param in zip(
        ours.named_parameters(), reference.parameters(), strict=True
    ):
        torch.testing.assert_close(ours_param, reference_param, rtol=1e-5, atol=1e-6, msg=name)


def test_softmax_rows_found_ahead_give_the_step_of_rows_found_in_the_call() -> None:
    torch.manual_seed(0)
    ahead = BiLM(tiny(), vocab_size=VOCAB).train()
    in_call = copy.deepcopy(ahead)
    steps = [TrainingStep.build(bilm, RECIPE) for bilm in (ahead, in_call)]
    sampler = LogUniformSampler(VOCAB)
    states: list = [None, None]
    for seed in (1, 2):
        windows = _windows(seed)
        generator = torch.Generator().manual_seed(seed)
        drawn = (sampler.sample_unique(20, generator), sampler.sample_unique(20, generator))
        targets = torch.stack([windows["forward_targets"], windows["backward_targets"]])
        rows = touched_rows(targets.numpy(), *(d.ids.numpy() for d in drawn))
        for index, softmax_rows in enumerate((torch.from_numpy(rows), None)):
            torch.manual_seed(seed)  # the same dropout masks
            result = steps[index](
                **windows, state=states[index], candidates=drawn, softmax_rows=softmax_rows
            )
            states[index] = result.state
    for (name, a), b in zip(ahead.named_parameters(), in_call.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def test_only_the_touched_softmax_rows_move() -> None:
    torch.manual_seed(0)
    bilm = BiLM(tiny(), vocab_size=VOCAB).train()
    before = bilm.softmax.weight.detach().clone()
    step = TrainingStep.build(bilm, RECIPE.model_copy(update={"clip_norm": 1e9}))
    windows = _windows(3)
    step(**windows, state=None)
    moved = (bilm.softmax.weight.detach() != before).any(dim=1)
    targets = torch.cat(
        [windows["forward_targets"].flatten(), windows["backward_targets"].flatten()]
    )
    assert moved[targets].all()
    assert moved.sum() < VOCAB  # sampled candidates and targets, not the whole vocabulary


def test_a_bilm_without_a_softmax_is_refused() -> None:
    with pytest.raises(ConfigError, match="vocab_size"):
        TrainingStep.build(BiLM(tiny()), RECIPE)
