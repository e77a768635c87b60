"""The one way to name and load a biLM: ``train --init-from``, ``evaluate --checkpoint``, ``adapt
--bilm``, registration and the pyfunc models all come here.

    resolve_bilm("runs/bilm-3f2a")                          # model, checkpoint or run directory
    resolve_bilm("s3://bucket/runs/bilm-3f2a/model")        # the same on any fsspec filesystem
    resolve_bilm("weights.hdf5", options="options.json")    # a bilm-tf release (DESIGN.md §3)
    resolve_bilm("models:/elmo-bilm@champion")              # a registered version (alias or number)
    resolve_bilm("runs:/<run id>/bilm")                     # MLflow artifacts holding a biLM
    load_bilm(reference, workdir) -> LoadedBiLM             # wherever the weights are needed

Two steps, because the weights are often needed elsewhere than where the source was named (train's
Ray workers, evaluate's and adapt's Ray tasks). The driver calls :func:`resolve_bilm`: a relative
path becomes absolute, the source must exist (a bad one fails before any job starts, as a
WeightsError naming it), and it is pinned — an alias becomes the version it points to *now*, a run
directory its latest checkpoint — so every process loads the same weights even if the alias moves
meanwhile. The :class:`BiLMReference` crosses the Ray boundary as a typed record and carries the
tracking store it was pinned in. :func:`load_bilm` then gives the biLM, a local directory in our
format (the artifact a task model carries) and, when the source knows it, the tokenizer its
pretraining text went through. A run using a biLM is tagged with :attr:`BiLMReference.tags`.

Remote directories are read with fsspec: a model directory or a checkpoint (``model/`` inside);
finding the latest checkpoint of a run directory needs a local one.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import fsspec
import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from pydantic import BaseModel, ConfigDict

from elmo_core.data.manifest import join_url
from elmo_core.errors import ConfigError, WeightsError
from elmo_core.model import serialization
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import CONFIG_FILE, MODEL_DIR, WEIGHTS_FILE, find_model_dir
from pipelines.common.tracking import use_tracking

SOURCE_HELP = (
    "biLM: model, checkpoint or run directory (local or fsspec URL), bilm-tf HDF5 (with its "
    "options), models:/name/N, models:/name@alias or runs:/ URI"
)
OPTIONS_HELP = "bilm-tf options.json of an HDF5 biLM"

# The artifacts of a registered biLM (pipelines.models.bilm_pyfunc): our directory, the
# dataset's vocabulary and manifest (whose ``tokenizer`` entry the pyfunc model rebuilds).
BILM_ARTIFACT = "bilm"
VOCAB_ARTIFACT = "vocab"
MANIFEST_ARTIFACT = "manifest"

# Run tags naming the biLM a run used.
MODEL_TAG = "elmo.bilm_model"
VERSION_TAG = "elmo.bilm_version"
PATH_TAG = "elmo.bilm_path"
OPTIONS_TAG = "elmo.bilm_options"
URI_TAG = "elmo.bilm_uri"

MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")
_REGISTERED = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>[^/]+))/?")
_RUN = re.compile(r"runs:/(?P<run_id>[^/]+)(?:/.*)?")

SourceKind = Literal["directory", "remote", "bilm_tf", "mlflow"]


class BiLMReference(BaseModel):
    """A pinned biLM source: what a process loads, and the tags that name it on a run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: SourceKind
    location: str  # our model directory (absolute path or URL), the HDF5 file, or an MLflow URI
    options: str | None = None  # bilm-tf options.json, for kind "bilm_tf"
    tracking_uri: str | None = None  # the store an MLflow URI was pinned in
    tags: dict[str, str] = {}


@dataclass(frozen=True)
class LoadedBiLM:
    """The biLM (eval mode), a local copy in our format, and its tokenizer description if known."""

    bilm: BiLM
    model_dir: Path
    tokenizer: dict[str, Any] | None = None


def resolve_bilm(
    source: str | Path, options: str | Path | None = None, *, options_key: str = "options"
) -> BiLMReference:
    """Check that ``source`` names a biLM and pin it; ``options_key`` is the setting that holds
    ``options`` (named when an HDF5 file comes without them)."""
    source = str(source)
    if options is not None or source.endswith((".hdf5", ".h5")):
        return _bilm_tf_reference(source, options, options_key)
    if source.startswith(MLFLOW_SCHEMES):
        return _mlflow_reference(source)
    if "://" in source:
        return _remote_reference(source)
    path = Path(source).expanduser().resolve()
    model_dir = find_model_dir(path)  # WeightsError naming the path when it holds no biLM
    return BiLMReference(kind="directory", location=str(model_dir), tags={PATH_TAG: str(path)})


def load_bilm(reference: BiLMReference, workdir: Path | None = None) -> LoadedBiLM:
    """The biLM of ``reference``; files it needs on disk go under ``workdir`` (by default a new
    temporary directory, left for the caller)."""
    if reference.kind == "directory":
        model_dir = Path(reference.location)
        return LoadedBiLM(bilm=serialization.load_bilm(model_dir).eval(), model_dir=model_dir)
    scratch = workdir or Path(tempfile.mkdtemp(prefix="elmo-bilm-"))
    scratch.mkdir(parents=True, exist_ok=True)
    if reference.kind == "mlflow":
        return _load_mlflow(reference, scratch)
    if reference.kind == "remote":
        model_dir = _copy_remote(reference.location, scratch / BILM_ARTIFACT)
        return LoadedBiLM(bilm=serialization.load_bilm(model_dir).eval(), model_dir=model_dir)
    from elmo_core.interop.bilm_tf import load_bilm as load_bilm_tf  # h5py only when needed

    assert reference.options is not None  # resolve_bilm requires them
    bilm = load_bilm_tf(reference.options, reference.location).eval()
    return LoadedBiLM(bilm=bilm, model_dir=serialization.save_bilm(bilm, scratch / BILM_ARTIFACT))


def manifest_tokenizer(manifest_file: Path) -> dict[str, Any] | None:
    """The tokenizer description a dataset's (or an import's) ``manifest.json`` names."""
    tokenizer = json.loads(manifest_file.read_text(encoding="utf-8")).get("tokenizer")
    return dict(tokenizer) if isinstance(tokenizer, dict) else None


# --- resolving -----------------------------------------------------------------------------------


def _bilm_tf_reference(weights: str, options: str | Path | None, options_key: str) -> BiLMReference:
    if options is None:
        raise ConfigError(
            f"the bilm-tf weight file {weights} needs its options.json", key=options_key
        )
    paths = [Path(p).expanduser().resolve() for p in (weights, options)]
    for path in paths:
        if not path.is_file():
            raise WeightsError("no such file", path=path)
    tags = {PATH_TAG: str(paths[0]), OPTIONS_TAG: str(paths[1])}
    return BiLMReference(kind="bilm_tf", location=str(paths[0]), options=str(paths[1]), tags=tags)


def _mlflow_reference(uri: str) -> BiLMReference:
    """A registered version pinned to its number; a run's artifacts checked to exist."""
    tracking_uri = use_tracking()
    client = MlflowClient(tracking_uri, tracking_uri)
    tags = {URI_TAG: uri}
    registered, run = _REGISTERED.fullmatch(uri), _RUN.fullmatch(uri)
    try:
        if registered is not None:
            name, alias = registered["name"], registered["alias"]
            if alias is not None:
                number = client.get_model_version_by_alias(name, alias).version
            else:
                number = client.get_model_version(name, registered["version"]).version
            tags |= {MODEL_TAG: name, VERSION_TAG: str(number)}
            uri = f"models:/{name}/{number}"
        elif run is not None:
            client.get_run(run["run_id"])
            uri = uri if "/" in uri.removeprefix("runs:/") else f"{uri}/"  # MLflow wants a path
    except MlflowException as err:
        kind = "registered model version" if registered is not None else "MLflow run"
        raise WeightsError(f"no such {kind}: {err.message}", path=tags[URI_TAG]) from None
    return BiLMReference(kind="mlflow", location=uri, tracking_uri=tracking_uri, tags=tags)


def _remote_reference(url: str) -> BiLMReference:
    """A remote model directory, or a checkpoint holding one as ``model/``."""
    url = url.rstrip("/")
    for candidate in (url, join_url(url, MODEL_DIR)):
        fs, path = fsspec.core.url_to_fs(join_url(candidate, CONFIG_FILE))
        if fs.isfile(path):
            return BiLMReference(kind="remote", location=candidate, tags={URI_TAG: url})
    raise WeightsError(
        f"no biLM at this URL ({CONFIG_FILE} or {MODEL_DIR}/{CONFIG_FILE}; a remote run "
        "directory is named by its model/ or a checkpoint)",
        path=url,
    )


# --- loading -------------------------------------------------------------------------------------


def _copy_remote(url: str, target: Path) -> Path:
    """Our two files of a remote model directory, copied into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with fsspec.open(join_url(url, name), "rb") as remote, open(target / name, "wb") as local:
            shutil.copyfileobj(remote, local)
    return target


def _load_mlflow(reference: BiLMReference, workdir: Path) -> LoadedBiLM:
    """Download the artifacts (a registered pyfunc model, or any folder holding our directory)."""
    local = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=reference.location,
            dst_path=str(workdir),
            tracking_uri=reference.tracking_uri,
            registry_uri=reference.tracking_uri,
        )
    )
    artifacts = _pyfunc_artifacts(local)
    if artifacts is not None:
        if BILM_ARTIFACT not in artifacts:
            raise WeightsError(
                f"{reference.location} is not a registered biLM (no '{BILM_ARTIFACT}' artifact)",
                path=str(local),
            )
        manifest = artifacts.get(MANIFEST_ARTIFACT)
        tokenizer = None if manifest is None else manifest_tokenizer(local / manifest["path"])
        model_dir = local / artifacts[BILM_ARTIFACT]["path"]
        return LoadedBiLM(
            bilm=serialization.load_bilm(model_dir).eval(), model_dir=model_dir, tokenizer=tokenizer
        )
    found = sorted(config.parent for config in local.rglob(CONFIG_FILE))
    preferred = [d for d in found if d.name == BILM_ARTIFACT] or found
    if not preferred:
        raise WeightsError(
            f"the MLflow artifacts hold no biLM directory ({CONFIG_FILE})", path=reference.location
        )
    return LoadedBiLM(bilm=serialization.load_bilm(preferred[0]).eval(), model_dir=preferred[0])


def _pyfunc_artifacts(local: Path) -> dict[str, dict[str, str]] | None:
    """The artifacts of a downloaded pyfunc model (by name), or None when it is not one."""
    if not (local / "MLmodel").is_file():
        return None
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    return dict(flavor.get("artifacts") or {})
