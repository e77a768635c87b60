"""register: a trained biLM becomes a version of the MLflow model ``elmo-bilm``, once per run.

The version is logged from the training run, so MLflow shows that run as its source; registering a
run again returns the version and decision recorded the first time.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path

import mlflow
import torch
from mlflow import MlflowClient
from mlflow.entities import LoggedModelInput
from mlflow.entities.model_registry import ModelVersion
from mlflow.models import Model
from mlflow.models.model import ModelInfo

from elmo_core.data.manifest import MANIFEST_NAME, load_manifest
from elmo_core.errors import ConfigError, DataError
from elmo_core.location import Location, join_url, sha256_file
from elmo_core.model.bilm import BiLM
from pipelines.common.handoff import CHECKPOINT_STEP_TAG, HandOn, TrainResult
from pipelines.evaluate.result import EvaluationResult
from pipelines.registry.model_card import (
    BILM_EXAMPLE,
    architecture_tags,
    bilm_card,
    bilm_version_description,
    example_frame,
    publish_card,
)
from pipelines.registry.policy import (
    PromotionDecision,
    apply_champion_policy,
    decision_tags,
    perplexity_of,
    recorded_decision,
)
from pipelines.registry.tags import (
    BACKWARD_PERPLEXITY_TAG,
    BILM_TF_TAG,
    BILM_VERSION_TAGS,
    CHAMPION,
    DATASET_TAG,
    DEFAULT_NAME,
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
from pipelines.serving import bilm_pyfunc
from pipelines.serving.bilm_loader import (
    BILM_ARTIFACT,
    MANIFEST_ARTIFACT,
    VOCAB_ARTIFACT,
    LoadedBiLM,
    load_bilm,
    resolve_bilm,
)
from pipelines.tracking.flow_runs import TRAIN_SECTION, VALIDATION_SECTION
from pipelines.tracking.logged_models import log_model_at, register_model
from pipelines.tracking.stage_runs import (
    DESCRIPTION_TAG,
    model_link,
    run_link,
    stage_run,
    stage_run_name,
    use_tracking,
)

BILM_TF_ARTIFACTS = "bilm_tf"  # run artifact folder of the HDF5 export


@dataclass(frozen=True)
class RegisteredBiLM:
    """A registered version and what the champion policy decided for it.

    ``run_id`` is the register run that registered the version, ``train_run_id`` the training run
    its weights came from, the version's source run (None when registered from elsewhere).
    ``perplexity`` is None when registered without an evaluation, ``decision`` when the policy was
    not applied; ``newly_registered`` is False when the training run had registered it before.
    """

    name: str
    version: int
    uri: str  # models:/<name>/<version>
    run_id: str
    perplexity: float | None
    decision: PromotionDecision | None = None
    newly_registered: bool = True
    train_run_id: str | None = None

    @property
    def alias(self) -> str | None:
        """The alias the decision gave the version (it may have moved on since)."""
        return None if self.decision is None else self.decision.alias

    @property
    def champion(self) -> bool:
        return self.alias == CHAMPION


@dataclass(frozen=True)
class DatasetFiles:
    """Local copies of the dataset files the model carries, with their hashes.

    ``vocab`` is None for imported weights without a vocabulary (then there is no softmax).
    """

    url: str
    vocab: Path | None
    manifest: Path
    vocab_sha256: str | None
    manifest_sha256: str


def register(
    source: str | Path,
    dataset_url: str,
    *,
    evaluation: EvaluationResult | None,
    options: str | Path | None = None,
    run_id: str | None = None,
    name: str = DEFAULT_NAME,
    hdf5_export: bool = True,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    checkpoint_tags: Mapping[str, str] | None = None,
    apply_policy: bool = True,
) -> RegisteredBiLM:
    """Register the biLM ``source`` as a version of ``name`` in a new register run; ``run_id``
    names the training run it came from, which registers one version at most (asked again, the
    version it registered comes back).

    ``dataset_url`` is the prepared dataset the biLM was trained on (local or fsspec URL); the
    register run is tagged with ``tags`` (a flow's) and with the biLM source's tags;
    ``checkpoint_tags`` (which model of the training run it is) go on the version and the run.
    """
    reference = resolve_bilm(source, options)  # a bad source fails before anything is logged
    if run_id is not None:
        existing = version_of_run(name, run_id)
        if existing is not None:
            return _existing_version(existing, apply_policy)
    with tempfile.TemporaryDirectory(prefix="elmo-register-") as scratch:
        loaded = load_bilm(reference, Path(scratch) / "source")
        dataset = fetch_dataset_files(dataset_url, Path(scratch) / "dataset")
        return register_bilm(
            loaded,
            dataset,
            evaluation=evaluation,
            run_id=run_id,
            name=name,
            hdf5_export=hdf5_export,
            parent_run_id=parent_run_id,
            tags={**reference.tags, **(tags or {})},
            checkpoint_tags=checkpoint_tags,
            apply_policy=apply_policy,
        )


def register_trained(
    result: TrainResult,
    data: str,
    evaluation: EvaluationResult,
    *,
    hand_on: HandOn = "best",
    name: str = DEFAULT_NAME,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> RegisteredBiLM:
    """The training run's model that ``hand_on`` picks (as
    :func:`~pipelines.evaluate.stage.evaluate_trained` does) as a version of ``name``, tagged
    with which one, judged by its ``evaluation`` (so evaluated first), registered once per
    training run: a re-run gets the same version back."""
    handed = result.handed_on(hand_on)
    return register(
        handed.model_dir,
        data,
        evaluation=evaluation,
        run_id=result.mlflow_run_id,
        name=name,
        parent_run_id=parent_run_id,
        tags=tags,
        checkpoint_tags=handed.tags,
    )


def register_bilm(
    source: LoadedBiLM,
    dataset: DatasetFiles,
    *,
    evaluation: EvaluationResult | None,
    run_id: str | None = None,
    name: str = DEFAULT_NAME,
    hdf5_export: bool = True,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    checkpoint_tags: Mapping[str, str] | None = None,
    apply_policy: bool = True,
) -> RegisteredBiLM:
    """A new version from a loaded biLM and the files it carries (local copies), always new;
    ``run_id`` is the training run it came from, if any, ``checkpoint_tags`` which of its
    models it is (on the version and the register run)."""
    exporter = _bilm_tf_exporter() if hdf5_export else None
    version_tags = model_version_tags(evaluation, dataset) | architecture_tags(source.bilm.config)
    version_tags |= checkpoint_tags or {}
    run_tags = {**(tags or {}), **(checkpoint_tags or {})}
    evaluate_run_id = evaluation.run_id if evaluation is not None else None
    for tag, linked in ((TRAIN_RUN_TAG, run_id), (EVALUATE_RUN_TAG, evaluate_run_id)):
        if linked is not None:
            version_tags[tag] = run_tags[tag] = linked
    with stage_run(
        "register",
        run_name=stage_run_name("register", name),
        parent_run_id=parent_run_id,
        tags=run_tags,
    ) as run:
        version_tags[REGISTER_RUN_TAG] = run.info.run_id
        mlflow.log_params({"model_name": name, "dataset": dataset.url})
        if exporter is not None:
            version_tags[BILM_TF_TAG] = _log_bilm_tf_export(exporter, source.bilm, run.info.run_id)
        step = int((checkpoint_tags or {}).get(CHECKPOINT_STEP_TAG, 0))
        info = log_bilm_model(source.model_dir, dataset, name, source_run_id=run_id, step=step)
        if evaluation is not None:  # its heldout perplexity, beside its validation one
            mlflow.log_metrics(evaluation.metrics(), model_id=info.model_id)
        kept = {tag: value for tag, value in version_tags.items() if tag in BILM_VERSION_TAGS}
        mlflow.set_tags({tag: v for tag, v in version_tags.items() if tag not in kept})
        version = register_model(info.model_uri, name, kept)
        runs = version_runs(version_tags)
        publish_card(bilm_card(name), version, bilm_version_description(version_tags, runs))
        mlflow.set_tag(DESCRIPTION_TAG, register_description(name, version, runs))
        decision = apply_champion_policy(name, version) if apply_policy else None
        if decision is not None:
            mlflow.set_tags(decision_tags(decision))
    return RegisteredBiLM(
        name=name,
        version=version,
        uri=f"models:/{name}/{version}",
        run_id=run.info.run_id,
        perplexity=None if evaluation is None else float(evaluation.perplexity),
        decision=decision,
        train_run_id=run_id,
    )


def version_of_run(name: str, run_id: str) -> ModelVersion | None:
    """The version of ``name`` the training run ``run_id`` became (the latest, should there be
    several)."""
    client = MlflowClient(use_tracking())
    found = client.search_model_versions(f"name = '{name}' and tags.`{TRAIN_RUN_TAG}` = '{run_id}'")
    return max(found, key=lambda version: int(version.version), default=None)


def _existing_version(version: ModelVersion, apply_policy: bool) -> RegisteredBiLM:
    """The record of a version registered earlier; the policy runs only if it never did."""
    decision = recorded_decision(version)
    if decision is None and apply_policy:
        decision = apply_champion_policy(version.name, int(version.version))
    return RegisteredBiLM(
        name=version.name,
        version=int(version.version),
        uri=f"models:/{version.name}/{version.version}",
        run_id=version.tags.get(REGISTER_RUN_TAG, str(version.run_id)),
        perplexity=perplexity_of(version),
        decision=decision,
        newly_registered=False,
        train_run_id=version.tags.get(TRAIN_RUN_TAG),
    )


def log_bilm_model(
    model_dir: Path,
    dataset: DatasetFiles,
    name: str,
    source_run_id: str | None = None,
    step: int = 0,
) -> ModelInfo:
    """Log the pyfunc model as ``name`` from the run ``source_run_id`` (default: the active run)
    as it was at its ``step`` (:func:`log_model_at`: with the run's biLM metrics at that step),
    from code, with explicit requirements and
    :data:`~pipelines.registry.model_card.BILM_EXAMPLE` as its input example. Logged from
    another run, it is also the active run's input.

    The input example costs one load of the model while logging (MLflow checks that it predicts),
    in exchange for a model whose page shows a call that ran.
    """
    active = mlflow.active_run()
    assert active is not None  # the register run
    source_run_id = source_run_id or active.info.run_id
    artifacts = {
        BILM_ARTIFACT: str(model_dir),
        MANIFEST_ARTIFACT: str(dataset.manifest),
    }
    if dataset.vocab is not None:
        artifacts[VOCAB_ARTIFACT] = str(dataset.vocab)

    def log(model_id: str) -> ModelInfo:
        return Model.log(  # pyfunc.log_model's call, into the model made for it
            artifact_path=None,
            name=name,
            flavor=mlflow.pyfunc,
            model_id=model_id,
            python_model=bilm_pyfunc.__file__,
            artifacts=artifacts,
            signature=bilm_pyfunc.model_signature(),
            input_example=example_frame(BILM_EXAMPLE),
            pip_requirements=model_requirements(),
        )

    bilm_metrics = (f"{TRAIN_SECTION}/", f"{VALIDATION_SECTION}/")
    run_name = MlflowClient().get_run(source_run_id).info.run_name
    described = (
        f"The biLM of run `{run_name}` as it was at step {step:,}: its metrics here are the "
        "run's at that step (among them its validation perplexity on a fixed heldout sample) "
        "and, once evaluated, its heldout perplexities."
        if step
        else f"The biLM of run `{run_name}`."
    )
    info = log_model_at(
        name, source_run_id, step, log, description=described, own_metrics=bilm_metrics
    )
    if source_run_id != active.info.run_id:
        MlflowClient().log_inputs(active.info.run_id, models=[LoggedModelInput(info.model_id)])
    return info


def model_requirements() -> list[str]:
    """What a logged model needs installed, pinned to this process's versions. Explicit, so
    MLflow does not infer them by importing the model in a subprocess."""
    return [
        f"elmo-platform=={package_version('elmo-platform')}",
        f"torch=={torch.__version__}",
        f"mlflow=={mlflow.__version__}",
    ]


def version_runs(version_tags: Mapping[str, str]) -> dict[str, str]:
    """What happened to the version in which run, as links into the MLflow UI: ``trained``,
    ``evaluated`` and ``registered`` (those its tags name)."""
    return {
        what: run_link(version_tags[tag])
        for what, tag in (
            ("trained", TRAIN_RUN_TAG),
            ("evaluated", EVALUATE_RUN_TAG),
            ("registered", REGISTER_RUN_TAG),
        )
        if tag in version_tags
    }


def register_description(name: str, version: int, runs: Mapping[str, str]) -> str:
    """The register run's description: the version it made and the runs it came from."""
    earlier = [f"{what} in {link}" for what, link in runs.items() if what != "registered"]
    came_from = f" ({'; '.join(earlier)})" if earlier else ""
    return f"Registered {model_link(f'models:/{name}/{version}', relative=True)}{came_from}."


def fetch_dataset_files(dataset_url: str, target: Path) -> DatasetFiles:
    """Copy the dataset's ``vocab.txt`` and ``manifest.json`` into ``target`` and hash them.

    A vocabulary whose hash differs from the one the manifest records is a DataError: the model
    would be registered against the wrong ids.
    """
    manifest = load_manifest(dataset_url)
    dataset = Location(dataset_url)
    copies = {}
    for relative in (MANIFEST_NAME, manifest.vocab.path):
        local = target / Path(relative).name
        dataset.download(relative, local)
        copies[relative] = (local, sha256_file(local))
    vocab, vocab_sha256 = copies[manifest.vocab.path]
    if vocab_sha256 != manifest.vocab.sha256:
        raise DataError(
            f"vocabulary sha256 {vocab_sha256[:12]}… differs from the manifest's "
            f"{manifest.vocab.sha256[:12]}…",
            path=join_url(dataset_url, manifest.vocab.path),
        )
    manifest_file, manifest_sha256 = copies[MANIFEST_NAME]
    return DatasetFiles(dataset_url, vocab, manifest_file, vocab_sha256, manifest_sha256)


def model_version_tags(
    evaluation: EvaluationResult | None, dataset: DatasetFiles
) -> dict[str, str]:
    """Tags of the new version; the perplexity tags (4 decimals: what a person reads, and finer
    than any comparison of the champion policy needs) are absent without an evaluation, the
    vocabulary's without a vocabulary."""
    tags = {DATASET_TAG: dataset.url, MANIFEST_HASH_TAG: dataset.manifest_sha256}
    if dataset.vocab_sha256 is not None:
        tags[VOCAB_HASH_TAG] = dataset.vocab_sha256
    if evaluation is not None:
        tags.update(
            {
                FORWARD_PERPLEXITY_TAG: f"{evaluation.forward_perplexity:.4f}",
                BACKWARD_PERPLEXITY_TAG: f"{evaluation.backward_perplexity:.4f}",
                PERPLEXITY_TAG: f"{evaluation.perplexity:.4f}",
                HELDOUT_HASH_TAG: evaluation.heldout_hash,
                HELDOUT_SPLIT_TAG: evaluation.split,
                PREDICTED_TOKENS_TAG: str(evaluation.num_tokens),
                PROTOCOL_TAG: str(evaluation.protocol),
            }
        )
    return tags


def _log_bilm_tf_export(
    exporter: Callable[[BiLM, Path, Path], None], bilm: BiLM, run_id: str
) -> str:
    """Write the bilm-tf HDF5 export into the run's ``bilm_tf`` folder; returns its URI."""
    with tempfile.TemporaryDirectory(prefix="elmo-register-") as scratch:
        export_dir = Path(scratch) / BILM_TF_ARTIFACTS
        exporter(bilm, export_dir / "options.json", export_dir / "weights.hdf5")
        mlflow.log_artifacts(str(export_dir), BILM_TF_ARTIFACTS)
    return f"runs:/{run_id}/{BILM_TF_ARTIFACTS}"


def _bilm_tf_exporter() -> Callable[[BiLM, Path, Path], None]:
    """The bilm-tf writer (without the softmax, as released weights), imported only when asked."""
    try:
        from elmo_core.interop.bilm_tf import write_bilm_tf
    except ImportError as err:
        raise ConfigError(
            f"the bilm-tf HDF5 export needs elmo_core.interop.bilm_tf ({err}); "
            "pass hdf5_export=False (--no-hdf5) to register without it",
            key="hdf5_export",
        ) from None
    return write_bilm_tf
