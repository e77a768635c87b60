"""import-weights against a real MLflow SQLite store: a tiny bilm-tf release becomes a version."""

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from elmo_core.errors import ConfigError, DataError
from elmo_core.interop.bilm_tf import write_bilm_tf
from elmo_core.model.bilm import BiLM
from elmo_core.model.elmo import remove_sentence_boundaries
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids
from pipelines import cli
from pipelines.registry import policy
from pipelines.registry import register as reg
from pipelines.registry.import_weights import IMPORT_WEIGHTS_TAG, STAGE, import_weights
from pipelines.serving.bilm_loader import load_bilm, resolve_bilm
from pipelines.tracking import stage_runs

pytestmark = pytest.mark.integration

VOCAB_SIZE = 100
WORDS = [f"w{index}" for index in range(VOCAB_SIZE - 3)]
# As released files are: </S> before <S>, a !!!MAXTERMID line; ours puts the specials first.
RELEASED_VOCAB = "\n".join(["</S>", "<S>", "!!!MAXTERMID", "<UNK>", *WORDS]) + "\n"
OUR_VOCAB = "\n".join(["<S>", "</S>", "<UNK>", *WORDS]) + "\n"


@pytest.fixture(scope="module")
def release(tmp_path_factory, isolated_home):
    """A tiny biLM written as bilm-tf files, and a store where it was imported without softmax."""
    root = tmp_path_factory.mktemp("import-weights")
    with isolated_home(root):
        torch.manual_seed(0)
        bilm = BiLM(tiny(), VOCAB_SIZE).eval()
        files = SimpleNamespace(
            options=root / "options.json",
            weights=root / "weights.hdf5",
            softmax=root / "softmax.hdf5",
            vocab=root / "vocab-released.txt",
        )
        write_bilm_tf(bilm, files.options, files.weights, files.softmax)
        files.vocab.write_text(RELEASED_VOCAB)
        imported = import_weights(files.options, files.weights)
        client = MlflowClient(stage_runs.use_tracking())
        yield SimpleNamespace(root=root, bilm=bilm, files=files, imported=imported, client=client)


def _layers(bilm: BiLM, tokens: list[str]) -> np.ndarray:
    """The biLM's layers for one sentence, boundaries stripped: ``(L, T, 2P)``."""
    with torch.no_grad():
        output = bilm(batch_to_ids([tokens]))
    stripped = [remove_sentence_boundaries(layer, output.mask)[0] for layer in output.activations]
    return torch.stack(stripped, dim=1)[0].numpy()


def test_imported_version_loads_by_uri_and_embeds_like_the_released_weights(release):
    assert (release.imported.uri, release.imported.perplexity) == ("models:/elmo-bilm/1", None)
    model = mlflow.pyfunc.load_model("models:/elmo-bilm/1")
    out = model.predict(pd.DataFrame({"sentence": ["The cat sat ."]}))
    assert out["tokens"][0] == ["The", "cat", "sat", "."]  # whitespace unless told
    embeddings = np.asarray(out["embeddings"][0])
    assert embeddings.shape == (3, 4, 32)
    np.testing.assert_allclose(
        embeddings, _layers(release.bilm, ["The", "cat", "sat", "."]), atol=1e-5
    )


def test_import_without_softmax_is_challenger_and_records_its_sources(release):
    assert release.imported.alias == "challenger"
    assert policy.current_champion("elmo-bilm", release.client) is None
    version = release.client.get_model_version("elmo-bilm", "1")
    assert "no heldout perplexity" in version.tags[policy.REASON_TAG]
    assert reg.VOCAB_HASH_TAG not in version.tags and reg.PERPLEXITY_TAG not in version.tags
    assert version.tags[reg.BILM_TF_TAG] == f"runs:/{release.imported.run_id}/bilm_tf"
    run = release.client.get_run(release.imported.run_id)
    assert run.data.tags[stage_runs.STAGE_TAG] == STAGE
    assert run.data.tags[IMPORT_WEIGHTS_TAG] == str(release.files.weights.resolve())
    loaded = load_bilm(resolve_bilm("models:/elmo-bilm/1")).bilm
    assert loaded.softmax is None


def test_command_imports_softmax_and_vocabulary_and_promotes_when_asked(release, capsys):
    files = release.files
    argv = ["import-weights", "--options", str(files.options), "--weights", str(files.weights)]
    argv += ["--softmax", str(files.softmax), "--vocab", str(files.vocab)]
    assert cli.main([*argv, "--tokenizer", "moses", "--alias", "champion"]) == 0
    assert "models:/elmo-bilm/2" in capsys.readouterr().out
    assert int(policy.current_champion("elmo-bilm", release.client).version) == 2
    version = release.client.get_model_version("elmo-bilm", "2")
    assert version.tags[policy.REASON_TAG] == "promoted explicitly"
    assert version.tags[reg.VOCAB_HASH_TAG] == hashlib.sha256(OUR_VOCAB.encode()).hexdigest()
    local = Path(mlflow.artifacts.download_artifacts("models:/elmo-bilm/2"))
    assert (local / "artifacts" / "vocab.txt").read_text() == OUR_VOCAB
    manifest = json.loads((local / "artifacts" / "manifest.json").read_text())
    assert manifest["tokenizer"]["name"] == "moses"
    loaded = load_bilm(resolve_bilm("models:/elmo-bilm/2")).bilm
    torch.testing.assert_close(loaded.softmax.weight, release.bilm.softmax.weight)
    model = mlflow.pyfunc.load_model("models:/elmo-bilm@champion")
    out = model.predict(pd.DataFrame({"sentence": ["The cat sat."]}))
    assert out["tokens"][0] == ["The", "cat", "sat", "."]  # Moses splits the full stop


def test_bad_inputs_fail_before_anything_is_registered(release, tmp_path, capsys):
    files = release.files
    with pytest.raises(ConfigError) as caught:
        import_weights(files.options, files.weights, name="bad", softmax_file=files.softmax)
    assert caught.value.key == "vocab_file"
    short = tmp_path / "short-vocab.txt"
    short.write_text("<S>\n</S>\n<UNK>\nthe\n")
    with pytest.raises(DataError, match="4 tokens, but the softmax has 100 rows"):
        import_weights(
            files.options, files.weights, name="bad", softmax_file=files.softmax, vocab_file=short
        )
    argv = ["import-weights", "--options", str(tmp_path / "missing.json")]
    assert cli.main([*argv, "--weights", str(files.weights), "--name", "bad"]) == 2
    assert "options file not found" in capsys.readouterr().err
    assert release.client.search_model_versions("name = 'bad'") == []


def test_refused_alias_leaves_the_version_where_the_policy_puts_it(release, capsys):
    files = release.files
    argv = ["import-weights", "--options", str(files.options), "--weights", str(files.weights)]
    assert cli.main([*argv, "--name", "refused", "--alias", "v1"]) == 2
    assert "reserved" in capsys.readouterr().err
    version = release.client.get_model_version_by_alias("refused", "challenger")
    assert int(version.version) == 1
