"""register's own logic on a real SQLite MLflow store: the tags a version gets, the runs it links,
the dataset files it carries, and a training run registered once. Whole registrations (pyfunc
model, HDF5 export, loading back) are in tests/integration/test_register.py."""

import hashlib
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from elmo_core.data.manifest import load_manifest
from elmo_core.errors import DataError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from pipelines.evaluate.result import EvaluationResult
from pipelines.registry import cli as registry_cli
from pipelines.registry import register as reg
from pipelines.registry.policy import PromotionDecision, decision_tags
from pipelines.registry.tags import (
    BACKWARD_PERPLEXITY_TAG,
    DATASET_TAG,
    EVALUATE_RUN_TAG,
    FORWARD_PERPLEXITY_TAG,
    HELDOUT_HASH_TAG,
    HELDOUT_SPLIT_TAG,
    MANIFEST_HASH_TAG,
    PERPLEXITY_TAG,
    PREDICTED_TOKENS_TAG,
    PROTOCOL_TAG,
    REGISTER_RUN_TAG,
    TRAIN_RUN_TAG,
    VOCAB_HASH_TAG,
)
from pipelines.tracking import stage_runs

EVALUATION = EvaluationResult(
    forward_perplexity=40.0,
    backward_perplexity=42.25,
    perplexity=41.1,
    num_tokens=1234,
    split="heldout",
    files=None,
    protocol="batched",
    heldout_hash="heldout-a",
)
FIRST_CHAMPION = PromotionDecision("champion", "first champion: heldout perplexity 20.5", None)


@pytest.fixture(scope="module")
def bilm_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return write_bilm_dir(BiLM(tiny(), 100), tmp_path_factory.mktemp("register") / "bilm")


VIEW = "?workflowType=machine_learning"  # a link that stays in the model-training view


def _train_run() -> str:
    with stage_runs.stage_run("train", run_name="train-for-register") as run:
        return run.info.run_id


def _version_of(store, name: str, train_run_id: str, tags: dict[str, str]) -> int:
    """A version of ``name`` from the training run, tagged as register leaves it."""
    if not store.search_registered_models(f"name = '{name}'"):
        store.create_registered_model(name)
    tags = {TRAIN_RUN_TAG: train_run_id, **tags}
    source = f"runs:/{train_run_id}/model"
    return int(store.create_model_version(name, source, run_id=train_run_id, tags=tags).version)


def _register_runs(store) -> list[str]:
    experiment = store.get_experiment_by_name(stage_runs.EXPERIMENT)
    found = store.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{stage_runs.STAGE_TAG}` = 'register'"
    )
    return [run.info.run_id for run in found]


def test_a_versions_tags_carry_its_evaluation_and_the_hashes_that_make_it_comparable():
    files = reg.DatasetFiles("s3://b/d", Path("vocab.txt"), Path("manifest.json"), "v", "m")
    tags = reg.model_version_tags(EVALUATION, files)
    assert tags == {
        DATASET_TAG: "s3://b/d",
        MANIFEST_HASH_TAG: "m",
        VOCAB_HASH_TAG: "v",
        FORWARD_PERPLEXITY_TAG: "40.0000",
        BACKWARD_PERPLEXITY_TAG: "42.2500",
        PERPLEXITY_TAG: "41.1000",
        HELDOUT_HASH_TAG: "heldout-a",
        HELDOUT_SPLIT_TAG: "heldout",
        PREDICTED_TOKENS_TAG: "1234",
        PROTOCOL_TAG: "batched",
    }
    rounded = reg.model_version_tags(
        EVALUATION.model_copy(update={"perplexity": 143.0274475836}), files
    )
    assert rounded[PERPLEXITY_TAG] == "143.0274"  # what a person reads in the UI


def test_without_an_evaluation_or_a_vocabulary_only_the_dataset_is_named():
    files = reg.DatasetFiles("released", None, Path("manifest.json"), None, "m")
    assert reg.model_version_tags(None, files) == {DATASET_TAG: "released", MANIFEST_HASH_TAG: "m"}


def test_the_register_runs_description_names_the_version_and_the_runs_before_it():
    runs = {"trained": "[t](u1)", "evaluated": "[e](u2)", "registered": "[r](u3)"}
    assert reg.register_description("elmo-bilm", 3, runs) == (
        f"Registered [models:/elmo-bilm/3](#/models/elmo-bilm/versions/3{VIEW}) "
        "(trained in [t](u1); evaluated in [e](u2))."
    )
    assert reg.register_description("x", 1, {"registered": "[r](u3)"}) == (
        f"Registered [models:/x/1](#/models/x/versions/1{VIEW})."
    )


def test_a_version_links_the_runs_its_tags_name_and_only_those(store):
    train_run_id = _train_run()
    with stage_runs.stage_run("register", run_name="register-links") as run:
        register_run_id = run.info.run_id
    runs = reg.version_runs({TRAIN_RUN_TAG: train_run_id, REGISTER_RUN_TAG: register_run_id})
    assert list(runs) == ["trained", "registered"]  # no evaluate run tagged: no link
    assert runs["trained"].startswith("[train-for-register](")
    assert f"/runs/{train_run_id}?" in runs["trained"]  # the run's page
    assert runs["registered"].startswith("[register-links](")
    assert EVALUATE_RUN_TAG not in reg.version_runs({})


def test_the_dataset_files_are_local_copies_hashed_as_the_manifest_records(make_dataset, tmp_path):
    dataset = make_dataset(["the cat sat", "the dog ran"], {"held.txt": ["the cat"]})
    files = reg.fetch_dataset_files(dataset, tmp_path / "copies")
    assert files.url == dataset and files.vocab is not None
    assert (files.vocab.parent, files.manifest.parent) == (tmp_path / "copies",) * 2
    vocab = (Path(dataset) / "vocab.txt").read_bytes()
    assert files.vocab.read_bytes() == vocab
    assert files.vocab_sha256 == hashlib.sha256(vocab).hexdigest()
    assert files.vocab_sha256 == load_manifest(dataset).vocab.sha256
    manifest = (Path(dataset) / "manifest.json").read_bytes()
    assert files.manifest.read_bytes() == manifest
    assert files.manifest_sha256 == hashlib.sha256(manifest).hexdigest()


def test_a_vocabulary_other_than_the_manifests_is_a_data_error_naming_it(make_dataset, tmp_path):
    dataset = make_dataset(["the cat sat"])
    with (Path(dataset) / "vocab.txt").open("a") as vocab:
        vocab.write("extra\n")
    with pytest.raises(DataError, match="differs from the manifest's") as raised:
        reg.fetch_dataset_files(dataset, tmp_path / "copies")
    assert raised.value.path == str(Path(dataset) / "vocab.txt")


def test_a_models_requirements_pin_the_installed_versions():
    pinned = {
        requirement.name: requirement.specifier
        for requirement in map(Requirement, reg.model_requirements())
    }
    assert sorted(pinned) == ["elmo-platform", "mlflow", "torch"]
    for name, specifier in pinned.items():
        assert str(specifier).startswith("==")
        assert specifier.contains(installed_version(name), prereleases=True), name


def test_the_latest_version_of_a_training_run_is_the_one_it_became(store):
    train_run_id = _train_run()
    for _ in range(2):
        _version_of(store, "latest", train_run_id, {})
    assert int(reg.version_of_run("latest", train_run_id).version) == 2
    assert reg.version_of_run("latest", _train_run()) is None
    assert reg.version_of_run("no-such-model", train_run_id) is None


def test_a_training_run_registered_before_comes_back_with_its_decision_and_nothing_new(
    store, bilm_dir, tmp_path
):
    train_run_id = _train_run()
    tags = {REGISTER_RUN_TAG: "the-register-run", PERPLEXITY_TAG: "20.5"}
    _version_of(store, "once", train_run_id, tags | decision_tags(FIRST_CHAMPION))
    before = _register_runs(store)

    nothing = str(tmp_path / "no-dataset")
    again = reg.register(bilm_dir, nothing, evaluation=None, run_id=train_run_id, name="once")

    assert again == reg.RegisteredBiLM(
        name="once",
        version=1,
        uri="models:/once/1",
        run_id="the-register-run",
        perplexity=20.5,
        decision=FIRST_CHAMPION,
        newly_registered=False,
        train_run_id=train_run_id,
    )
    assert again.champion
    assert _register_runs(store) == before  # no run, no version, no dataset read
    assert len(store.search_model_versions("name = 'once'")) == 1


def test_a_version_registered_without_the_policy_gets_its_decision_once_asked(
    store, bilm_dir, tmp_path
):
    train_run_id = _train_run()
    _version_of(store, "undecided", train_run_id, {PERPLEXITY_TAG: "20.5"})
    ask = {"evaluation": None, "run_id": train_run_id, "name": "undecided"}

    skipped = reg.register(bilm_dir, str(tmp_path), apply_policy=False, **ask)
    decided = reg.register(bilm_dir, str(tmp_path), **ask)
    recalled = reg.register(bilm_dir, str(tmp_path), **ask)

    assert skipped.decision is None and skipped.alias is None
    assert decided.decision == recalled.decision == FIRST_CHAMPION
    assert int(store.get_model_version_by_alias("undecided", "champion").version) == 1


def test_the_command_line_says_a_run_was_registered_before(store, bilm_dir, tmp_path, capsys):
    train_run_id = _train_run()
    tags = {REGISTER_RUN_TAG: "r-1", PERPLEXITY_TAG: "20.5"} | decision_tags(FIRST_CHAMPION)
    _version_of(store, "cli-once", train_run_id, tags)
    args = [str(bilm_dir), str(tmp_path), "--run-id", train_run_id, "--name", "cli-once"]
    assert registry_cli.main(["register", *args]) == 0
    assert capsys.readouterr().out.strip() == (
        "models:/cli-once/1 (run r-1, registered before, heldout perplexity 20.50, "
        "alias champion: first champion: heldout perplexity 20.5)"
    )
