"""register against a real MLflow SQLite store: versions, tags, HDF5 export, loading back."""

import hashlib
import sys
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from elmo_core.errors import ConfigError, DataError, WeightsError
from elmo_core.interop.bilm_tf import read_bilm_tf
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids
from pipelines.common.handoff import CHECKPOINT_STEP_TAG, CHECKPOINT_TAG
from pipelines.evaluate.result import EvaluationResult
from pipelines.registry import cli as registry_cli
from pipelines.registry import register as reg
from pipelines.registry.tags import (
    KIND_TAG,
    PRESET_TAG,
    PREVIOUS_CHAMPION_TAG,
    PROMOTION_ALIAS_TAG,
    REASON_TAG,
    SIZE_TAG,
    SUPERSEDED_BY_TAG,
)
from pipelines.serving.bilm_loader import (
    PATH_TAG,
    VERSION_TAG,
    initial_bilm,
    load_bilm,
    resolve_bilm,
)
from pipelines.tracking import stage_runs
from pipelines.tracking.datasets import log_dataset
from pipelines.tracking.flow_runs import TRAIN_LOSS_METRIC
from pipelines.tracking.train_progress import VALIDATION_PERPLEXITY

pytestmark = pytest.mark.integration


def _evaluation(
    forward: float, backward: float, perplexity: float, run_id: str | None = None
) -> EvaluationResult:
    """An evaluation of 1234 heldout tokens (recorded in the evaluate run ``run_id``)."""
    return EvaluationResult(
        forward_perplexity=forward,
        backward_perplexity=backward,
        perplexity=perplexity,
        num_tokens=1234,
        split="heldout",
        files=["heldout-00000"],
        protocol="batched",
        heldout_hash="abc123",
        run_id=run_id,
    )


def _logged_model_id(version) -> str:
    """The LoggedModel a version was registered from (SQLite stores keep it in the source)."""
    assert version.source.startswith("models:/m-")
    return version.source.removeprefix("models:/")


@pytest.fixture(scope="module")
def registry(tmp_path_factory, isolated_home, registry_dataset):
    """A fresh store with ``elmo-bilm`` registered twice (two evaluations of one tiny biLM)."""
    root = tmp_path_factory.mktemp("register")
    with isolated_home(root):
        torch.manual_seed(0)
        model_dir = write_bilm_dir(BiLM(tiny(), 100), root / "bilm")
        dataset = registry_dataset(root / "dataset")
        evaluations = [_evaluation(40.5, 41.5, 41.0), _evaluation(30.25, 31.75, 31.0)]
        results = [reg.register(model_dir, str(dataset), evaluation=e) for e in evaluations]
        uri = stage_runs.use_tracking()
        yield SimpleNamespace(
            root=root,
            uri=uri,
            client=MlflowClient(uri),
            model_dir=model_dir,
            dataset=dataset,
            evaluations=evaluations,
            results=results,
        )


POLICY_TAGS = {PROMOTION_ALIAS_TAG, REASON_TAG, PREVIOUS_CHAMPION_TAG, SUPERSEDED_BY_TAG}


def test_registering_twice_creates_versions_tagged_with_their_evaluation(registry):
    assert [(r.name, r.version, r.uri) for r in registry.results] == [
        ("elmo-bilm", 1, "models:/elmo-bilm/1"),
        ("elmo-bilm", 2, "models:/elmo-bilm/2"),
    ]
    assert [r.perplexity for r in registry.results] == [41.0, 31.0]
    vocab_sha = hashlib.sha256((registry.dataset / "vocab.txt").read_bytes()).hexdigest()
    manifest_sha = hashlib.sha256((registry.dataset / "manifest.json").read_bytes()).hexdigest()
    for result, evaluation in zip(registry.results, registry.evaluations, strict=True):
        version = registry.client.get_model_version("elmo-bilm", str(result.version))
        assert version.run_id == result.run_id  # no training run: the register run logged it
        assert version.tags[reg.REGISTER_RUN_TAG] == result.run_id
        assert version.tags[reg.PERPLEXITY_TAG] == f"{evaluation.perplexity:.4f}"
        assert version.tags[reg.HELDOUT_HASH_TAG] == "abc123"
        assert version.tags[reg.VOCAB_HASH_TAG] == vocab_sha
        # A version keeps the few tags users filter on; the register run holds the rest, and
        # the description says them
        assert set(version.tags) <= reg.BILM_VERSION_TAGS | POLICY_TAGS, version.tags
        run = registry.client.get_run(result.run_id)
        assert run.data.tags[stage_runs.STAGE_TAG] == "register"
        assert run.data.tags[reg.PREDICTED_TOKENS_TAG] == "1234"
        forward = run.data.tags[reg.FORWARD_PERPLEXITY_TAG]
        assert forward == f"{evaluation.forward_perplexity:.4f}"
        backward = run.data.tags[reg.BACKWARD_PERPLEXITY_TAG]
        assert backward == f"{evaluation.backward_perplexity:.4f}"
        assert run.data.tags[reg.MANIFEST_HASH_TAG] == manifest_sha
        assert (
            f"(forward {float(forward):.2f}, backward {float(backward):.2f})" in version.description
        )
        assert "scored on split heldout (1,234 predictions)" in version.description
        assert f"dataset manifest sha256 {manifest_sha[:12]}…" in version.description
    assert registry.results[0].run_id != registry.results[1].run_id


def test_registered_model_embeds_text_in_a_fresh_process(registry, fresh_python):
    script = (
        "import json, mlflow, pandas as pd\n"
        "model = mlflow.pyfunc.load_model('models:/elmo-bilm/1')\n"
        "out = model.predict(pd.DataFrame({'sentence': ['The cat sat on the mat.']}))\n"
        "import numpy as np\n"
        "print(json.dumps({'tokens': out['tokens'][0],\n"
        "                  'shape': list(np.asarray(out['embeddings'][0]).shape)}))\n"
    )
    printed = fresh_python(script, registry.uri, registry.root.parent)
    assert printed == {
        "tokens": ["The", "cat", "sat", "on", "the", "mat", "."],
        "shape": [3, 7, 32],
    }


def test_predict_through_mlflow_validates_params_and_reads_both_columns(registry):
    model = mlflow.pyfunc.load_model("models:/elmo-bilm/2")
    by_text = model.predict(pd.DataFrame({"sentence": ["The cat, again."]}))
    tokens = by_text["tokens"][0]
    by_tokens = model.predict(pd.DataFrame({"tokens": [tokens]}))
    layers = np.asarray(by_text["embeddings"][0])
    np.testing.assert_array_equal(layers, np.asarray(by_tokens["embeddings"][0]))
    top = model.predict(pd.DataFrame({"tokens": [tokens]}), params={"output": "layer", "layer": 2})
    np.testing.assert_array_equal(np.asarray(top["embeddings"][0]), layers[2])
    mixed = model.predict(
        pd.DataFrame({"tokens": [tokens]}),
        params={"output": "mix", "weights": [0.5, 0.5, 0.0], "mean_pool": True},
    )
    expected = (0.5 * layers[0] + 0.5 * layers[1]).mean(axis=0)
    np.testing.assert_allclose(np.asarray(mixed["embeddings"][0]), expected, atol=1e-6)
    assert isinstance(model.unwrap_python_model().bilm, BiLM)
    # Refused as `mlflow models serve` refuses them (tests/integration/test_serving.py).
    with pytest.raises(MlflowException, match="layer 7 out of range"):
        model.predict(pd.DataFrame({"tokens": [tokens]}), params={"output": "layer", "layer": 7})
    with pytest.raises(MlflowException, match=r"unknown predict params \['layers'\]"):
        model.predict(pd.DataFrame({"tokens": [tokens]}), params={"layers": 2})  # MLflow drops it


def test_load_registered_bilm_returns_the_saved_weights(registry, tmp_path):
    loaded = load_bilm(resolve_bilm("models:/elmo-bilm/1"), tmp_path)
    bilm, bilm_dir = loaded.bilm, loaded.model_dir
    assert (bilm_dir / "model.pt").is_file() and bilm_dir.is_relative_to(tmp_path)
    saved = torch.load(registry.model_dir / "model.pt", weights_only=True)
    loaded = bilm.state_dict()
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[key], loaded[key]) for key in saved)


def test_hdf5_export_is_logged_in_the_run_and_named_by_a_tag(registry, tmp_path):
    result = registry.results[0]
    version = registry.client.get_model_version("elmo-bilm", "1")
    assert version.tags[reg.BILM_TF_TAG] == f"runs:/{result.run_id}/bilm_tf"
    local = Path(
        mlflow.artifacts.download_artifacts(version.tags[reg.BILM_TF_TAG], dst_path=str(tmp_path))
    )
    assert sorted(path.name for path in local.iterdir()) == ["options.json", "weights.hdf5"]
    exported = read_bilm_tf(local / "options.json", local / "weights.hdf5")
    original = load_bilm(resolve_bilm("models:/elmo-bilm/1")).bilm
    char_ids = batch_to_ids([["The", "cat", "sat"]])
    with torch.no_grad():
        ours = original.eval()(char_ids).activations
        theirs = exported(char_ids).activations
    for layer, exported_layer in zip(ours, theirs, strict=True):
        torch.testing.assert_close(exported_layer, layer)


def test_a_version_registered_from_a_training_run_links_it_both_ways(registry):
    with stage_runs.stage_run("train", run_name="train-for-register") as run:
        train_run_id = run.info.run_id
        log_dataset(str(registry.dataset), "training")
        for step, perplexity in ((4, 900.0), (8, 700.0)):
            mlflow.log_metrics({VALIDATION_PERPLEXITY: perplexity, TRAIN_LOSS_METRIC: 6.0}, step)
        mlflow.log_metric("system/cpu_utilization_percentage", 50.0, step=4)  # a sample's number
    result = reg.register(
        registry.model_dir,
        str(registry.dataset),
        evaluation=None,
        run_id=train_run_id,
        name="elmo-bilm-imported",
        hdf5_export=False,
        checkpoint_tags={CHECKPOINT_TAG: "best", CHECKPOINT_STEP_TAG: "4"},
    )
    assert (result.version, result.train_run_id, result.perplexity) == (1, train_run_id, None)
    version = registry.client.get_model_version("elmo-bilm-imported", "1")
    # The version's source run (the UI's "Source run") is the training run, logged from it ...
    assert version.run_id == train_run_id != result.run_id
    tags = version.tags
    assert tags[reg.TRAIN_RUN_TAG] == train_run_id
    assert tags[reg.REGISTER_RUN_TAG] == result.run_id
    assert reg.PERPLEXITY_TAG not in tags and reg.HELDOUT_HASH_TAG not in tags
    vocab = (registry.dataset / "vocab.txt").read_bytes()
    assert tags[reg.VOCAB_HASH_TAG] == hashlib.sha256(vocab).hexdigest()
    assert reg.BILM_TF_TAG not in tags
    experiment = run.info.experiment_id
    train_page = f"#/experiments/{experiment}/runs/{train_run_id}"  # relative: any address
    assert f"trained in run [train-for-register]({train_page}?workflowType=" in version.description
    assert version.description.startswith("No heldout perplexity: 2x32_16 biLM (tiny) on ")
    logged = registry.client.get_logged_model(_logged_model_id(version))
    assert logged.name == "elmo-bilm-imported" and logged.source_run_id == train_run_id
    train_run = registry.client.get_run(train_run_id)
    assert logged.tags["mlflow.source.name"] == train_run.data.tags["mlflow.source.name"]
    # It holds the step-4 model: its metrics are the run's biLM metrics at step 4, measured on the
    # training dataset, and no system sample, whatever its number
    own = {(m.key, m.step, m.value, m.dataset_name) for m in logged.metrics or []}
    named = registry.dataset.name
    assert own == {(VALIDATION_PERPLEXITY, 4, 900.0, named), (TRAIN_LOSS_METRIC, 4, 6.0, named)}
    # ... and the training run's page lists the logged model at its step and the version
    outputs = [(output.model_id, output.step) for output in train_run.outputs.model_outputs]
    assert outputs == [(logged.model_id, 4)]
    assert logged.tags["mlflow.note.content"].startswith(  # the page's description
        "The biLM of run `train-for-register` as it was at step 4: "
    )
    found = registry.client.search_model_versions(f"run_id = '{train_run_id}'")
    assert [(v.name, str(v.version)) for v in found] == [("elmo-bilm-imported", "1")]
    register_run = registry.client.get_run(result.run_id)
    assert register_run.data.tags[reg.TRAIN_RUN_TAG] == train_run_id
    assert [model.model_id for model in register_run.inputs.model_inputs] == [logged.model_id]
    assert register_run.data.tags["mlflow.note.content"].startswith(
        "Registered [models:/elmo-bilm-imported/1](#/models/elmo-bilm-imported/versions/1"
        "?workflowType=machine_learning) (trained in [train-for-register]("
    )
    assert not [key for key in register_run.data.metrics if not key.startswith("system/")]


def test_missing_hdf5_exporter_fails_before_anything_is_registered(registry, monkeypatch):
    monkeypatch.setitem(sys.modules, "elmo_core.interop.bilm_tf", None)  # import now fails
    with pytest.raises(ConfigError) as caught:
        reg.register(registry.model_dir, str(registry.dataset), evaluation=None, name="no-hdf5")
    assert caught.value.key == "hdf5_export"
    assert registry.client.search_model_versions("name = 'no-hdf5'") == []


def test_vocabulary_differing_from_the_manifest_is_a_data_error(
    registry, registry_dataset, tmp_path
):
    dataset = registry_dataset(tmp_path / "dataset")
    with (dataset / "vocab.txt").open("a") as vocab:
        vocab.write("extra\n")
    with pytest.raises(DataError, match="sha256"):
        reg.register(registry.model_dir, str(dataset), evaluation=None, hdf5_export=False)


def test_command_line_registers_with_an_evaluation_file(registry, tmp_path, capsys):
    evaluation = tmp_path / "evaluation.json"
    _evaluation(12.5, 13.5, 13.0).write(evaluation)
    args = [str(registry.model_dir), str(registry.dataset), "--no-hdf5", "--name", "elmo-cli"]
    assert registry_cli.main(["register", *args, "--evaluation", str(evaluation)]) == 0
    assert "models:/elmo-cli/1" in capsys.readouterr().out
    tags = registry.client.get_model_version("elmo-cli", "1").tags
    assert tags[reg.PERPLEXITY_TAG] == "13.0000"
    evaluation.write_text("{}")
    assert registry_cli.main(["register", *args, "--evaluation", str(evaluation)]) == 2
    assert "not an evaluation result" in capsys.readouterr().err


def test_a_training_run_registers_one_version_and_one_decision_however_often_asked(registry):
    with stage_runs.stage_run("train", run_name="train-twice") as run:
        train_run_id = run.info.run_id
    first, again = (
        reg.register(
            registry.model_dir,
            str(registry.dataset),
            evaluation=_evaluation(20.0, 21.0, 20.5),
            run_id=train_run_id,
            name="elmo-bilm-once",
            hdf5_export=False,
        )
        for _ in range(2)
    )
    assert first.newly_registered and not again.newly_registered
    assert (again.version, again.uri, again.run_id) == (1, "models:/elmo-bilm-once/1", first.run_id)
    assert again.train_run_id == first.train_run_id == train_run_id
    assert first.decision is not None and first.decision.reason.startswith("first champion")
    assert again.decision == first.decision and again.champion
    assert again.perplexity == first.perplexity == 20.5
    assert len(registry.client.search_model_versions("name = 'elmo-bilm-once'")) == 1
    register_runs = registry.client.search_runs(
        [registry.client.get_run(train_run_id).info.experiment_id],
        filter_string=f"tags.`{reg.TRAIN_RUN_TAG}` = '{train_run_id}'",
    )
    assert [run.info.run_id for run in register_runs] == [first.run_id]  # no second run


def test_inside_a_flow_the_register_run_is_a_child_with_the_flow_tags_and_the_decision(registry):
    with stage_runs.stage_run("flow", run_name="flow-register") as parent:
        pass
    with stage_runs.stage_run("train", run_name="train-in-flow", parent_run_id=parent.info.run_id):
        train_run_id = mlflow.active_run().info.run_id
    with stage_runs.stage_run("evaluate", run_name="evaluate-in-flow") as evaluated:
        pass
    result = reg.register(
        registry.model_dir,
        str(registry.dataset),
        evaluation=_evaluation(50.0, 52.0, 51.0, evaluated.info.run_id),
        run_id=train_run_id,
        name="elmo-bilm",
        hdf5_export=False,
        parent_run_id=parent.info.run_id,
        tags={"elmo.flow": "test"},
    )
    run = registry.client.get_run(result.run_id)
    tags = run.data.tags
    assert run.info.status == "FINISHED" and run.info.run_name == "register-elmo-bilm"
    assert tags["mlflow.parentRunId"] == parent.info.run_id
    assert (tags[stage_runs.STAGE_TAG], tags["elmo.flow"]) == ("register", "test")
    assert tags[reg.TRAIN_RUN_TAG] == train_run_id
    assert tags[reg.EVALUATE_RUN_TAG] == evaluated.info.run_id
    assert tags[PATH_TAG] == str(registry.model_dir)  # the biLM it registered
    assert tags["elmo.promotion_alias"] == "challenger"  # 51 does not beat the champion's 31
    assert tags["elmo.promotion_reason"] == result.decision.reason
    assert tags["elmo.promotion_previous_champion"] == "2"
    version = registry.client.get_model_version("elmo-bilm", str(result.version))
    version_tags = version.tags
    assert reg.EVALUATE_RUN_TAG not in version_tags  # the description links it
    assert "; evaluated in run [evaluate-in-flow](" in version.description
    assert {key: tags[key] for key in version_tags if key.startswith("elmo.promotion")} == {
        key: value for key, value in version_tags.items() if key.startswith("elmo.promotion")
    }
    assert run.data.params == {"model_name": "elmo-bilm", "dataset": str(registry.dataset)}


def test_the_logged_model_shows_its_heldout_perplexities_as_the_version_tags_say(registry):
    for result, evaluation in zip(registry.results, registry.evaluations, strict=True):
        version = registry.client.get_model_version("elmo-bilm", str(result.version))
        logged = registry.client.get_logged_model(_logged_model_id(version))
        assert logged.source_run_id == result.run_id and logged.name == "elmo-bilm"
        # The Models page shows the perplexities and no system sample; the register run, which
        # links them to the model, holds nothing else of its own.
        linked = {m.key: m.value for m in logged.metrics or []}
        assert linked == pytest.approx(evaluation.metrics())
        register_metrics = registry.client.get_run(result.run_id).data.metrics
        assert {key for key in register_metrics if not key.startswith("system/")} == set(linked)
        assert float(version.tags[reg.PERPLEXITY_TAG]) == pytest.approx(
            evaluation.perplexity, abs=5e-5
        )


def test_the_model_says_what_it_is_and_how_to_call_it_and_carries_an_input_example(registry):
    model = registry.client.get_registered_model("elmo-bilm")
    assert model.tags[KIND_TAG] == "bilm"
    call = 'mlflow.pyfunc.load_model("models:/elmo-bilm@champion")'
    assert call in model.description
    assert 'pd.DataFrame({"sentence": ["The cat sat on the mat."]})' in model.description
    assert "`tokens`" in model.description and "`embeddings`" in model.description
    version = registry.client.get_model_version("elmo-bilm", "2")
    assert version.tags[PRESET_TAG] == "tiny"
    assert version.tags[SIZE_TAG] == "2x32_16"
    assert version.description.startswith(
        "31.00 heldout perplexity (forward 30.25, backward 31.75): 2x32_16 biLM (tiny) on "
    )
    example = mlflow.models.Model.load("models:/elmo-bilm/2").load_input_example()
    assert example.to_dict("list") == {"sentence": ["The cat sat on the mat."]}


def test_init_from_a_registered_alias_is_pinned_to_its_version_and_loads_in_a_worker(registry):
    champion = registry.client.get_model_version_by_alias("elmo-bilm", "champion").version
    reference = resolve_bilm("models:/elmo-bilm@champion")
    assert reference.location == f"models:/elmo-bilm/{champion}"
    assert reference.tags[VERSION_TAG] == str(champion)
    assert reference.tracking_uri == registry.uri
    started = initial_bilm(tiny(), 100, reference)  # what each training worker does
    saved = torch.load(registry.model_dir / "model.pt", weights_only=True)
    assert all(torch.equal(started.state_dict()[key], saved[key]) for key in saved)


def test_an_unknown_alias_is_a_weights_error_naming_the_uri(registry):
    with pytest.raises(WeightsError, match="no such registered model version") as raised:
        resolve_bilm("models:/elmo-bilm@nobody")
    assert "models:/elmo-bilm@nobody" in str(raised.value)
