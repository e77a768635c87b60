"""register: a trained biLM becomes a new version of the MLflow model ``elmo-bilm``.

The version is a pyfunc model logged from code (:mod:`pipelines.models.bilm_pyfunc`) whose artifacts
are our biLM directory, the dataset's ``vocab.txt`` and ``manifest.json`` (the tokenizer used at
inference). Its tags carry what a promotion policy compares (heldout perplexities) and what makes
two numbers comparable at all (the heldout, vocabulary and manifest hashes). A bilm-tf HDF5 export
(``options.json`` + ``weights.hdf5``, DESIGN.md §3) is logged next to it in the run, for tools that
read the original format. After registering, :mod:`pipelines.registry.policy` decides whether the
version takes the ``champion`` or the ``challenger`` alias (``apply_policy=False`` skips that).

Released bilm-tf weights come in through :func:`register_bilm` with files of their own (no
dataset; maybe no vocabulary): see :mod:`pipelines.registry.import_weights`.

Loading back: ``mlflow.pyfunc.load_model("models:/elmo-bilm/3")`` embeds text;
:func:`load_registered_bilm` gives the :class:`~elmo_core.model.bilm.BiLM` itself.
"""

from __future__ import annotations

import hashlib
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Protocol

import fsspec
import mlflow
import torch
import typer
from mlflow.models import Model
from pydantic import BaseModel, ConfigDict, ValidationError

from elmo_core.data.manifest import MANIFEST_NAME, join_url, load_manifest
from elmo_core.errors import ConfigError, DataError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import load_bilm
from pipelines.common.cli_runner import run_command
from pipelines.common.tracking import stage_run, use_tracking
from pipelines.models import bilm_pyfunc

DEFAULT_NAME = "elmo-bilm"
MODEL_ARTIFACT = "bilm"  # the logged model's name inside the run
BILM_TF_ARTIFACTS = "bilm_tf"  # run artifact folder of the HDF5 export

# Model version tags (strings, as MLflow stores them).
FORWARD_PERPLEXITY_TAG = "elmo.perplexity.forward"
BACKWARD_PERPLEXITY_TAG = "elmo.perplexity.backward"
PERPLEXITY_TAG = "elmo.perplexity"  # geometric mean: exp(mean(½(CE_f + CE_b)))
HELDOUT_HASH_TAG = "elmo.heldout_hash"
HELDOUT_SPLIT_TAG = "elmo.heldout_split"
HELDOUT_TOKENS_TAG = "elmo.heldout_tokens"
PROTOCOL_TAG = "elmo.perplexity_protocol"
VOCAB_HASH_TAG = "elmo.vocab_sha256"
MANIFEST_HASH_TAG = "elmo.manifest_sha256"
DATASET_TAG = "elmo.dataset"
BILM_TF_TAG = "elmo.bilm_tf"


class Evaluation(Protocol):
    """What register reads from :class:`pipelines.evaluate.stage.EvaluationResult`."""

    @property
    def forward_perplexity(self) -> float: ...
    @property
    def backward_perplexity(self) -> float: ...
    @property
    def perplexity(self) -> float: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def split(self) -> str: ...
    @property
    def protocol(self) -> object: ...
    @property
    def heldout_hash(self) -> str: ...


@dataclass(frozen=True)
class RegisteredBiLM:
    """The new model version; ``perplexity`` is None when registered without an evaluation."""

    name: str
    version: int
    uri: str  # models:/<name>/<version>
    run_id: str
    perplexity: float | None
    alias: str | None = None  # the alias the registry policy gave it, if it ran


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
    model_dir: str | Path,
    dataset_url: str,
    *,
    evaluation: Evaluation | None,
    run_id: str | None = None,
    name: str = DEFAULT_NAME,
    hdf5_export: bool = True,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    apply_policy: bool = True,
) -> RegisteredBiLM:
    """Log ``model_dir`` as a pyfunc model into ``run_id`` (or a new register run) and register it.

    ``dataset_url`` is the prepared dataset the biLM was trained on (local or fsspec URL).
    """
    with tempfile.TemporaryDirectory(prefix="elmo-register-dataset-") as scratch:
        dataset = fetch_dataset_files(dataset_url, Path(scratch))
        return register_bilm(
            model_dir,
            dataset,
            evaluation=evaluation,
            run_id=run_id,
            name=name,
            hdf5_export=hdf5_export,
            parent_run_id=parent_run_id,
            tags=tags,
            apply_policy=apply_policy,
        )


def register_bilm(
    model_dir: str | Path,
    dataset: DatasetFiles,
    *,
    evaluation: Evaluation | None,
    run_id: str | None = None,
    name: str = DEFAULT_NAME,
    hdf5_export: bool = True,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    apply_policy: bool = True,
) -> RegisteredBiLM:
    """:func:`register` with the files the model carries already at hand (local copies)."""
    bilm = load_bilm(model_dir)  # a broken directory fails before anything is logged
    exporter = _bilm_tf_exporter() if hdf5_export else None
    with tempfile.TemporaryDirectory(prefix="elmo-register-") as scratch:
        version_tags = model_version_tags(evaluation, dataset)
        with stage_run(
            "register",
            run_name=f"register-{name}",
            run_id=run_id,
            parent_run_id=parent_run_id,
            tags=tags,
        ) as run:
            if exporter is not None:
                export_dir = Path(scratch) / BILM_TF_ARTIFACTS
                exporter(bilm, export_dir / "options.json", export_dir / "weights.hdf5")
                mlflow.log_artifacts(str(export_dir), BILM_TF_ARTIFACTS)
                version_tags[BILM_TF_TAG] = f"runs:/{run.info.run_id}/{BILM_TF_ARTIFACTS}"
            info = log_bilm_model(Path(model_dir), dataset)
            registered = mlflow.register_model(info.model_uri, name, tags=version_tags)
    alias = None
    if apply_policy:
        from pipelines.registry.policy import apply_champion_policy  # it reads our tag names

        alias = apply_champion_policy(name, int(registered.version)).alias
    return RegisteredBiLM(
        name=name,
        version=int(registered.version),
        uri=f"models:/{name}/{registered.version}",
        run_id=run.info.run_id,
        perplexity=None if evaluation is None else float(evaluation.perplexity),
        alias=alias,
    )


def log_bilm_model(model_dir: Path, dataset: DatasetFiles) -> mlflow.models.model.ModelInfo:
    """Log the pyfunc model into the active run, from code, with explicit requirements.

    Explicit requirements skip MLflow's inference, which imports the model in a subprocess. No
    input example: validating it would load the whole biLM a second time while logging.
    """
    artifacts = {
        bilm_pyfunc.BILM_ARTIFACT: str(model_dir),
        bilm_pyfunc.MANIFEST_ARTIFACT: str(dataset.manifest),
    }
    if dataset.vocab is not None:
        artifacts[bilm_pyfunc.VOCAB_ARTIFACT] = str(dataset.vocab)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*input example was not provided")
        return mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT,
            python_model=bilm_pyfunc.__file__,
            artifacts=artifacts,
            signature=bilm_pyfunc.model_signature(),
            pip_requirements=[
                f"elmo-platform=={package_version('elmo-platform')}",
                f"torch=={torch.__version__}",
                f"mlflow=={mlflow.__version__}",
            ],
        )


def fetch_dataset_files(dataset_url: str, target: Path) -> DatasetFiles:
    """Copy the dataset's ``vocab.txt`` and ``manifest.json`` into ``target`` and hash them.

    A vocabulary whose hash differs from the one the manifest records is a DataError: the model
    would be registered against the wrong ids.
    """
    manifest = load_manifest(dataset_url)
    target.mkdir(parents=True, exist_ok=True)
    copies = {}
    for relative in (MANIFEST_NAME, manifest.vocab.path):
        url = join_url(dataset_url, relative)
        with fsspec.open(url, "rb") as handle:
            data = handle.read()
        local = target / Path(relative).name
        local.write_bytes(data)
        copies[relative] = (local, hashlib.sha256(data).hexdigest())
    vocab, vocab_sha256 = copies[manifest.vocab.path]
    if vocab_sha256 != manifest.vocab.sha256:
        raise DataError(
            f"vocabulary sha256 {vocab_sha256[:12]}… differs from the manifest's "
            f"{manifest.vocab.sha256[:12]}…",
            path=join_url(dataset_url, manifest.vocab.path),
        )
    manifest_file, manifest_sha256 = copies[MANIFEST_NAME]
    return DatasetFiles(dataset_url, vocab, manifest_file, vocab_sha256, manifest_sha256)


def model_version_tags(evaluation: Evaluation | None, dataset: DatasetFiles) -> dict[str, str]:
    """Tags of the new version; the perplexity tags are absent without an evaluation, the
    vocabulary's without a vocabulary."""
    tags = {DATASET_TAG: dataset.url, MANIFEST_HASH_TAG: dataset.manifest_sha256}
    if dataset.vocab_sha256 is not None:
        tags[VOCAB_HASH_TAG] = dataset.vocab_sha256
    if evaluation is not None:
        tags.update(
            {
                FORWARD_PERPLEXITY_TAG: repr(float(evaluation.forward_perplexity)),
                BACKWARD_PERPLEXITY_TAG: repr(float(evaluation.backward_perplexity)),
                PERPLEXITY_TAG: repr(float(evaluation.perplexity)),
                HELDOUT_HASH_TAG: evaluation.heldout_hash,
                HELDOUT_SPLIT_TAG: evaluation.split,
                HELDOUT_TOKENS_TAG: str(evaluation.num_tokens),
                PROTOCOL_TAG: str(evaluation.protocol),
            }
        )
    return tags


def _bilm_tf_exporter() -> Callable[[BiLM, Path, Path], None]:
    """The bilm-tf writer (without the softmax, as released weights), imported only when asked."""
    try:
        from elmo_core.interop.bilm_tf import save_bilm as save_bilm_tf
    except ImportError as err:
        raise ConfigError(
            f"the bilm-tf HDF5 export needs elmo_core.interop.bilm_tf ({err}); "
            "pass hdf5_export=False (--no-hdf5) to register without it",
            key="hdf5_export",
        ) from None
    return save_bilm_tf


def load_registered_bilm(uri: str, *, dst_path: str | Path | None = None) -> tuple[BiLM, Path]:
    """The biLM of a registered version (``models:/elmo-bilm/3``, ``models:/elmo-bilm@champion``).

    Downloads the model (into ``dst_path`` or a fresh temporary directory) and returns the biLM
    with the local path of its directory in our format (``model_config.json`` + ``model.pt``).
    """
    use_tracking()
    local = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=None if dst_path is None else str(dst_path)
        )
    )
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    artifacts = flavor.get("artifacts") or {}
    if bilm_pyfunc.BILM_ARTIFACT not in artifacts:
        raise WeightsError(
            f"{uri} is not a registered biLM (no '{bilm_pyfunc.BILM_ARTIFACT}' artifact)",
            path=str(local),
        )
    bilm_dir = local / artifacts[bilm_pyfunc.BILM_ARTIFACT]["path"]
    return load_bilm(bilm_dir), bilm_dir


# --- command line --------------------------------------------------------------------------------


class EvaluationFile(BaseModel):
    """``dataclasses.asdict(EvaluationResult)`` saved as JSON: the fields register reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    forward_perplexity: float
    backward_perplexity: float
    perplexity: float
    num_tokens: int
    split: str
    protocol: str
    heldout_hash: str

    @classmethod
    def read(cls, path: Path) -> EvaluationFile:
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as err:
            raise DataError(f"not an evaluation result: {err}", path=str(path)) from None


def register_command(
    model_dir: Annotated[
        Path, typer.Argument(help="biLM directory (model_config.json + model.pt)")
    ],
    dataset: Annotated[str, typer.Argument(help="prepared dataset directory or fsspec URL")],
    evaluation: Annotated[
        Path | None, typer.Option(help="evaluation result JSON (perplexities, heldout hash)")
    ] = None,
    name: Annotated[str, typer.Option(help="registered model name")] = DEFAULT_NAME,
    run_id: Annotated[str | None, typer.Option(help="log into this (training) run")] = None,
    hdf5: Annotated[bool, typer.Option(help="also log a bilm-tf HDF5 export")] = True,
) -> None:
    """Register a trained biLM as a new version of an MLflow model."""
    result = register(
        model_dir,
        dataset,
        evaluation=None if evaluation is None else EvaluationFile.read(evaluation),
        run_id=run_id,
        name=name,
        hdf5_export=hdf5,
    )
    perplexity = "no evaluation" if result.perplexity is None else f"{result.perplexity:.2f}"
    typer.echo(
        f"{result.uri} (run {result.run_id}, heldout perplexity {perplexity}, alias {result.alias})"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.registry register`` (the same command as ``elmo register``)."""
    return run_command(register_command, argv)
