"""bf16 autocast (the GPU training default) on CPU: the biLM runs and stays close to float32."""

import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids


@pytest.mark.parametrize("impl", ["reference", "cudnn", "fused"])
def test_activations_and_loss_under_bf16_autocast_are_close_to_float32(impl):
    config = tiny().model_copy(update={"lstm_impl": impl, "dropout": 0.0})
    if impl == "cudnn":
        unclipped = config.lstm.model_copy(update={"cell_clip": None, "proj_clip": None})
        config = config.model_copy(update={"lstm": unclipped})
    torch.manual_seed(0)
    model = BiLM(config, vocab_size=100).eval()
    ids = batch_to_ids([["a", "rose", "is", "a", "rose"], ["is", "a"]])
    with torch.no_grad():
        expected = model(ids).activations
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(ids).activations
    for layer, want in zip(got, expected, strict=True):
        scale = want.abs().max()
        torch.testing.assert_close(layer.float(), want, rtol=0, atol=0.05 * float(scale))

    windows = {
        "forward_inputs": ids,
        "forward_targets": torch.randint(0, 100, ids.shape[:2]),
        "backward_inputs": ids.flip(1),
        "backward_targets": torch.randint(0, 100, ids.shape[:2]),
    }
    model.train()
    torch.manual_seed(1)
    full = model.training_loss(**windows)[0].loss
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = model.training_loss(**windows)[0].loss
    mixed.backward()
    mixed, full = mixed.detach(), full.detach()
    assert torch.isfinite(mixed) and abs(float(mixed) - float(full)) < 0.02 * float(full)
