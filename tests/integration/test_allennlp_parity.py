"""Golden parity with the original TensorFlow biLM, on outputs it dumped itself.

The allennlp 0.9.0 source distribution ships a tiny bilm-tf model (``options.json``,
``lm_weights.hdf5``) together with what bilm-tf computed from it: 30 sentences of
``sentences.json`` (three lists of ten, whitespace-tokenized) run through the *stateful* TF graph in
10 batches of 3, row k of batch i being ``sentences[k][i]``; ``lm_embeddings_k.hdf5`` holds under
key ``str(i)`` that row's top layer, ``(2, n_tokens, P)`` = [forward, backward] without the
``<S>``/``</S>`` positions. The files are stored in ``tests/fixtures/bilm_tf`` (their README names
their origin), so parity is checked wherever the tree is, network or not.

Measured: max |ours − TF| = 1.2e-6 over all 30 sentences (float32 on CPU); the test allows 1e-5.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmo_core.interop.bilm_tf import read_bilm_tf, write_bilm_tf
from elmo_core.model.bilm import BiLM
from elmo_core.text.char_ids import batch_to_ids

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bilm_tf"
TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The model is tiny: one intra-op thread avoids pool contention on a busy 2-core runner."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _released(*, stateful: bool = False) -> BiLM:
    """The stored bilm-tf model, read by our loader."""
    return read_bilm_tf(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5", stateful=stateful)


def _expected() -> list[list[np.ndarray]]:
    """``expected[k][i] (n_tokens, 2P)``: row k of batch i, forward then backward."""
    expected = []
    for k in range(3):
        with h5py.File(FIXTURES / f"lm_embeddings_{k}.hdf5", "r") as dumped:
            expected.append([np.concatenate(dumped[str(i)][...], axis=-1) for i in range(10)])
    return expected


def _max_difference(bilm: BiLM, device: str = "cpu") -> list[float]:
    """Run the 10 batches in order; per batch, the largest |ours − TF| over its real tokens."""
    sentences = json.loads((FIXTURES / "sentences.json").read_text())
    expected = _expected()
    bilm.to(device)
    differences = []
    for i in range(10):
        batch = [sentences[k][i].split() for k in range(3)]
        with torch.no_grad():
            output = bilm(batch_to_ids(batch).to(device))
        top, mask = output.activations[-1].cpu(), output.mask.cpu()  # (3, T+2, 2P), (3, T+2)
        worst = 0.0
        for k, tokens in enumerate(batch):
            assert int(mask[k].sum()) == len(tokens) + 2
            ours = top[k, 1 : len(tokens) + 1].numpy()  # without <S> and </S>
            assert ours.shape == expected[k][i].shape
            worst = max(worst, float(np.abs(ours - expected[k][i]).max()))
        differences.append(worst)
    return differences


def test_stateful_bilm_reproduces_the_tensorflow_outputs():
    differences = _max_difference(_released(stateful=True))
    assert max(differences) < TOLERANCE, differences


def test_our_export_of_the_released_file_reproduces_them_too(tmp_path):
    write_bilm_tf(_released(), tmp_path / "options.json", tmp_path / "weights.hdf5")
    bilm = read_bilm_tf(tmp_path / "options.json", tmp_path / "weights.hdf5", stateful=True)
    assert max(_max_difference(bilm)) < TOLERANCE


def test_the_dump_depends_on_the_carried_state():
    """Stateless, only the first batch matches: the golden files do check the state carry."""
    differences = _max_difference(_released(stateful=False))
    assert differences[0] < TOLERANCE
    assert min(differences[1:]) > 100 * TOLERANCE, differences


@pytest.mark.gpu
@pytest.mark.usefixtures("ieee_float32")
def test_on_cuda_in_float32_the_outputs_match_tensorflow():
    assert max(_max_difference(_released(stateful=True), "cuda")) < TOLERANCE


@pytest.mark.gpu
@pytest.mark.usefixtures("ieee_float32")
def test_on_cuda_in_float32_every_layer_equals_the_cpu():
    sentences = json.loads((FIXTURES / "sentences.json").read_text())
    ids = batch_to_ids([sentence.split() for sentence in sentences[0]])
    bilm = _released()
    with torch.no_grad():
        on_cpu = bilm(ids).activations
        on_cuda = bilm.to("cuda")(ids.to("cuda")).activations
    for cpu_layer, cuda_layer in zip(on_cpu, on_cuda, strict=True):
        torch.testing.assert_close(cuda_layer.cpu(), cpu_layer, rtol=0, atol=TOLERANCE)
