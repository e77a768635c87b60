"""Where the frozen biLM of an adaptation comes from: a checkpoint, a bilm-tf release or MLflow.

    resolve_bilm("runs/bilm-3f2a")                          # model, checkpoint or run directory
    resolve_bilm("weights.hdf5", options="options.json")    # a bilm-tf release (DESIGN.md §3)
    resolve_bilm("models:/elmo-bilm@champion")              # a registered version (alias or number)

Resolution happens in two steps because adaptation jobs run as Ray tasks. The driver calls
:func:`resolve_bilm`: it checks that the source exists (a bad path fails before any job starts)
and pins it — an alias becomes the version number it points to *now*, so every job of one call
adapts the same weights even if the alias moves meanwhile. Each job then calls
:func:`load_bilm_source` to get the biLM, a local directory in our format (the artifact its task
model carries) and, when the source knows it, the tokenizer its pretraining text went through.
A standalone run is tagged with :attr:`BiLMReference.tags`, naming exactly what it used.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import Model

from elmo_core.errors import WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import find_model_dir, load_bilm, save_bilm
from pipelines.common.tracking import use_tracking
from pipelines.evaluate.stage import MLFLOW_SCHEMES, load_checkpoint
from pipelines.models import bilm_pyfunc
from pipelines.registry.register import load_registered_bilm

SourceKind = Literal["checkpoint", "bilm_tf", "registered", "mlflow"]
MODEL_TAG = "elmo.bilm_model"
VERSION_TAG = "elmo.bilm_version"
PATH_TAG = "elmo.bilm_path"
OPTIONS_TAG = "elmo.bilm_options"
URI_TAG = "elmo.bilm_uri"
_REGISTERED = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>[^/]+))/?")


@dataclass(frozen=True)
class BiLMReference:
    """A pinned biLM source: what a job loads, and the tags that name it on the run."""

    kind: SourceKind
    location: str  # absolute path, or an MLflow URI (models:/name/N for registered versions)
    options: str | None = None  # bilm-tf options.json, for kind "bilm_tf"
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadedBiLM:
    """The frozen biLM, a local copy in our format, and its tokenizer description if known."""

    bilm: BiLM
    model_dir: Path
    tokenizer: dict[str, Any] | None


def resolve_bilm(source: str, options: str | None = None) -> BiLMReference:
    """Check that ``source`` names a biLM and pin it (registered aliases → version numbers)."""
    if options is not None or source.endswith((".hdf5", ".h5")):
        return _bilm_tf_reference(source, options)
    match = _REGISTERED.fullmatch(source)
    if match is not None:
        return _registered_reference(match["name"], match["alias"], match["version"], source)
    if source.startswith(MLFLOW_SCHEMES):
        return BiLMReference("mlflow", source, tags={URI_TAG: source})
    path = Path(source).expanduser().resolve()
    model_dir = find_model_dir(path)  # WeightsError naming the path when it holds no biLM
    return BiLMReference("checkpoint", str(model_dir), tags={PATH_TAG: str(path)})


def load_bilm_source(reference: BiLMReference, workdir: Path) -> LoadedBiLM:
    """The biLM of ``reference`` in eval mode; files it needs on disk go under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    if reference.kind == "checkpoint":
        model_dir = Path(reference.location)
        return LoadedBiLM(load_bilm(model_dir).eval(), model_dir, None)
    if reference.kind == "registered":
        bilm, model_dir = load_registered_bilm(reference.location, dst_path=workdir)
        return LoadedBiLM(bilm.eval(), model_dir, _registered_tokenizer(model_dir))
    if reference.kind == "bilm_tf":
        from elmo_core.interop.bilm_tf import load_bilm as load_bilm_tf

        assert reference.options is not None
        bilm = load_bilm_tf(reference.options, reference.location)
    else:
        use_tracking()
        bilm = load_checkpoint(reference.location)
    return LoadedBiLM(bilm.eval(), save_bilm(bilm, workdir / bilm_pyfunc.BILM_ARTIFACT), None)


def _bilm_tf_reference(weights: str, options: str | None) -> BiLMReference:
    if options is None:
        raise WeightsError(
            "a bilm-tf weight file needs its options.json (--bilm-options)", path=weights
        )
    paths = [Path(p).expanduser().resolve() for p in (weights, options)]
    for path in paths:
        if not path.is_file():
            raise WeightsError("no such file", path=path)
    tags = {PATH_TAG: str(paths[0]), OPTIONS_TAG: str(paths[1])}
    return BiLMReference("bilm_tf", str(paths[0]), str(paths[1]), tags)


def _registered_reference(
    name: str, alias: str | None, version: str | None, source: str
) -> BiLMReference:
    """``models:/name@alias`` or ``models:/name/N`` → the version number it names now."""
    client = MlflowClient(use_tracking())
    try:
        if alias is not None:
            number = client.get_model_version_by_alias(name, alias).version
        else:
            number = client.get_model_version(name, str(version)).version
    except MlflowException as err:
        raise WeightsError(
            f"no such registered model version: {err.message}", path=source
        ) from None
    tags = {MODEL_TAG: name, VERSION_TAG: str(number), URI_TAG: source}
    return BiLMReference("registered", f"models:/{name}/{number}", tags=tags)


def _registered_tokenizer(model_dir: Path) -> dict[str, Any] | None:
    """The tokenizer named by the registered model's ``manifest`` artifact."""
    root = next((p for p in model_dir.parents if (p / "MLmodel").is_file()), None)
    if root is None:
        return None
    artifacts = Model.load(str(root)).flavors.get("python_function", {}).get("artifacts") or {}
    entry = artifacts.get(bilm_pyfunc.MANIFEST_ARTIFACT)
    if entry is None:
        return None
    manifest = json.loads((root / entry["path"]).read_text(encoding="utf-8"))
    tokenizer = manifest.get("tokenizer")
    return dict(tokenizer) if isinstance(tokenizer, dict) else None
