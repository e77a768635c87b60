"""The one way to name and load a biLM, for every stage, registration and the pyfunc models.

Two steps, because weights are often loaded elsewhere than where they were named: the driver's
:func:`resolve_bilm` pins the source (an alias to its version now, a run to its latest checkpoint),
and :func:`load_bilm` loads that pin in any process (sources: docs/registry.md, "Naming a biLM").
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from pydantic import BaseModel, ConfigDict

from elmo_core.config import ModelConfig
from elmo_core.errors import ConfigError, WeightsError
from elmo_core.location import Location, join_url
from elmo_core.model import serialization
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import CONFIG_FILE, MODEL_DIR, WEIGHTS_FILE, find_model_dir
from elmo_core.model.warm_start import WARMUP_FILE
from pipelines.tracking.stage_runs import use_tracking

log = logging.getLogger(__name__)

# The artifacts of a registered biLM (pipelines.serving.bilm_pyfunc): our directory, the
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
        return LoadedBiLM(bilm=serialization.read_bilm_dir(model_dir).eval(), model_dir=model_dir)
    scratch = workdir or Path(tempfile.mkdtemp(prefix="elmo-bilm-"))
    scratch.mkdir(parents=True, exist_ok=True)
    if reference.kind == "mlflow":
        return _load_mlflow(reference, scratch)
    if reference.kind == "remote":
        model_dir = _copy_remote(reference.location, scratch / BILM_ARTIFACT)
        return LoadedBiLM(bilm=serialization.read_bilm_dir(model_dir).eval(), model_dir=model_dir)
    from elmo_core.interop.bilm_tf import read_bilm_tf  # h5py only when needed

    assert reference.options is not None  # resolve_bilm requires them
    bilm = read_bilm_tf(reference.options, reference.location).eval()
    return LoadedBiLM(
        bilm=bilm, model_dir=serialization.write_bilm_dir(bilm, scratch / BILM_ARTIFACT)
    )


def initial_bilm(config: ModelConfig, vocab_size: int, source: BiLMReference | None) -> BiLM:
    """A fresh biLM, or one holding the weights of ``source`` (continued pretraining).

    The token encoder and LSTMs must match ``config`` in shape; the softmax is kept only when the
    source has one of ``vocab_size`` rows (a new vocabulary starts from a new softmax).
    """
    bilm = BiLM(config, vocab_size)
    if source is None:
        return bilm
    with tempfile.TemporaryDirectory(prefix="elmo-init-from-") as scratch:
        start = load_bilm(source, Path(scratch)).bilm
    state = start.state_dict()
    if start.vocab_size != vocab_size:
        log.warning(
            "softmax re-initialised: %s has vocabulary size %s, the dataset %d",
            source.location,
            start.vocab_size,
            vocab_size,
        )
        state = {k: v for k, v in state.items() if not k.startswith("softmax.")}
    try:
        missing, unexpected = bilm.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise WeightsError(
            f"weights do not fit the model config: {err}", path=source.location
        ) from None
    missing = [name for name in missing if not name.startswith("softmax.")]
    if missing or unexpected:
        raise WeightsError(
            f"weights do not fit the model config: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}",
            path=source.location,
        )
    return bilm


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
        if Location(candidate).is_file(CONFIG_FILE):
            return BiLMReference(kind="remote", location=candidate, tags={URI_TAG: url})
    raise WeightsError(
        f"no biLM at this URL ({CONFIG_FILE} or {MODEL_DIR}/{CONFIG_FILE}; a remote run "
        "directory is named by its model/ or a checkpoint)",
        path=url,
    )


# --- loading -------------------------------------------------------------------------------------


def _copy_remote(url: str, target: Path) -> Path:
    """The files of a remote model directory (the warm-up sentences where it has them), copied
    into ``target``."""
    source = Location(url)
    optional = [WARMUP_FILE] if source.exists(WARMUP_FILE) else []
    for name in (CONFIG_FILE, WEIGHTS_FILE, *optional):
        source.download(name, target / name)
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
            bilm=serialization.read_bilm_dir(model_dir).eval(),
            model_dir=model_dir,
            tokenizer=tokenizer,
        )
    found = sorted(config.parent for config in local.rglob(CONFIG_FILE))
    preferred = [d for d in found if d.name == BILM_ARTIFACT] or found
    if not preferred:
        raise WeightsError(
            f"the MLflow artifacts hold no biLM directory ({CONFIG_FILE})", path=reference.location
        )
    return LoadedBiLM(bilm=serialization.read_bilm_dir(preferred[0]).eval(), model_dir=preferred[0])


def _pyfunc_artifacts(local: Path) -> dict[str, dict[str, str]] | None:
    """The artifacts of a downloaded pyfunc model (by name), or None when it is not one."""
    if not (local / "MLmodel").is_file():
        return None
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    return dict(flavor.get("artifacts") or {})
