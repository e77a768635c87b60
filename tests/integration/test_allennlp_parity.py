"""Golden parity with the original TensorFlow biLM, on outputs it dumped itself.

The allennlp 0.9.0 source distribution ships a tiny bilm-tf model (``options.json``,
``lm_weights.hdf5``) together with what bilm-tf computed from it: 30 sentences of
``sentences.json`` (three lists of ten, whitespace-tokenized) run through the *stateful* TF graph in
10 batches of 3, row k of batch i being ``sentences[k][i]``; ``lm_embeddings_k.hdf5`` holds under
key ``str(i)`` that row's top layer, ``(2, n_tokens, P)`` = [forward, backward] without the
``<S>``/``</S>`` positions. The files are fetched with pip into a cache at test time (never
committed) and used as data only.

Measured: max |ours − TF| = 1.2e-6 over all 30 sentences (float32 on CPU); the test allows 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmo_core.interop.bilm_tf import load_bilm, save_bilm
from elmo_core.model.bilm import BiLM
from elmo_core.text.char_ids import batch_to_ids

pytestmark = pytest.mark.integration

PACKAGE = "allennlp==0.9.0"
FIXTURE_DIR = "allennlp-0.9.0/allennlp/tests/fixtures/elmo/"
FILES = ["options.json", "lm_weights.hdf5", "sentences.json"] + [
    f"lm_embeddings_{k}.hdf5" for k in range(3)
]
TOLERANCE = 1e-5


def _cache_dir() -> Path:
    root = os.environ.get("ELMO_TEST_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "elmo-platform"
    return base / "allennlp-0.9.0"


def _fetch(cache: Path) -> None:
    """``pip download`` the sdist, keep only the fixture files, drop the tarball."""
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run(
        [*command, PACKAGE, "-d", str(cache)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    tarball = next(cache.glob("allennlp-0.9.0.tar*"))
    with tarfile.open(tarball) as archive:
        for name in FILES:
            member = archive.extractfile(FIXTURE_DIR + name)
            assert member is not None, name
            partial = cache / f".{name}.partial"
            partial.write_bytes(member.read())
            partial.replace(cache / name)  # each file whole or not at all
    tarball.unlink()


@pytest.fixture(scope="module")
def fixtures() -> Path:
    cache = _cache_dir()
    if not all((cache / name).is_file() for name in FILES):
        try:
            _fetch(cache)
        except (OSError, subprocess.SubprocessError, StopIteration, KeyError) as err:
            detail = getattr(err, "stderr", b"") or b""
            reason = detail.decode(errors="replace").strip().splitlines()[-1:] or [repr(err)]
            message = f"cannot fetch {PACKAGE} from the package index: {reason[0]}"
            if os.environ.get("ELMO_REQUIRE_GOLDEN"):  # the GPU suite: parity must not go unchecked
                pytest.fail(f"{message}; the golden files are not in {cache}")
            pytest.skip(message)
    return cache


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The model is tiny: one intra-op thread avoids pool contention on a busy 2-core runner."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _expected(fixtures: Path) -> list[list[np.ndarray]]:
    """``expected[k][i] (n_tokens, 2P)``: row k of batch i, forward then backward."""
    expected = []
    for k in range(3):
        with h5py.File(fixtures / f"lm_embeddings_{k}.hdf5", "r") as dumped:
            expected.append([np.concatenate(dumped[str(i)][...], axis=-1) for i in range(10)])
    return expected


def _max_difference(bilm: BiLM, fixtures: Path, device: str = "cpu") -> list[float]:
    """Run the 10 batches in order; per batch, the largest |ours − TF| over its real tokens."""
    sentences = json.loads((fixtures / "sentences.json").read_text())
    expected = _expected(fixtures)
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


def test_stateful_bilm_reproduces_the_tensorflow_outputs(fixtures):
    bilm = load_bilm(fixtures / "options.json", fixtures / "lm_weights.hdf5", stateful=True)
    differences = _max_difference(bilm, fixtures)
    assert max(differences) < TOLERANCE, differences


def test_our_export_of_the_released_file_reproduces_them_too(fixtures, tmp_path):
    released = load_bilm(fixtures / "options.json", fixtures / "lm_weights.hdf5")
    save_bilm(released, tmp_path / "options.json", tmp_path / "weights.hdf5")
    bilm = load_bilm(tmp_path / "options.json", tmp_path / "weights.hdf5", stateful=True)
    assert max(_max_difference(bilm, fixtures)) < TOLERANCE


def test_the_dump_depends_on_the_carried_state(fixtures):
    """Stateless, only the first batch matches: the golden files do check the state carry."""
    bilm = load_bilm(fixtures / "options.json", fixtures / "lm_weights.hdf5", stateful=False)
    differences = _max_difference(bilm, fixtures)
    assert differences[0] < TOLERANCE
    assert min(differences[1:]) > 100 * TOLERANCE, differences


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_in_float32_the_outputs_match_tensorflow(fixtures, monkeypatch):
    """fp32 on the GPU: TF32 off (cuDNN's convolutions would take it by default)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    bilm = load_bilm(fixtures / "options.json", fixtures / "lm_weights.hdf5", stateful=True)
    assert max(_max_difference(bilm, fixtures, "cuda")) < TOLERANCE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_in_float32_every_layer_equals_the_cpu(fixtures, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    sentences = json.loads((fixtures / "sentences.json").read_text())
    ids = batch_to_ids([sentence.split() for sentence in sentences[0]])
    bilm = load_bilm(fixtures / "options.json", fixtures / "lm_weights.hdf5")
    with torch.no_grad():
        on_cpu = bilm(ids).activations
        on_cuda = bilm.to("cuda")(ids.to("cuda")).activations
    for cpu_layer, cuda_layer in zip(on_cpu, on_cuda, strict=True):
        torch.testing.assert_close(cuda_layer.cpu(), cpu_layer, rtol=0, atol=TOLERANCE)
