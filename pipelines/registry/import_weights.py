"""import-weights: released bilm-tf weights become a version of ``elmo-bilm`` like a trained one.

What a release lacks is decided here: no dataset, a vocabulary only when given, no perplexity and
so ``challenger`` unless ``--alias champion`` (docs/registry.md, "Imported weights").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Literal, get_args

from elmo_core.errors import ConfigError, DataError
from elmo_core.interop.bilm_tf import read_bilm_tf
from elmo_core.location import sha256_file
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.text.tokenize import Tokenizer
from elmo_core.text.vocab import read_vocab, vocab_text
from pipelines.registry.policy import PromotionDecision, apply_champion_policy, promote
from pipelines.registry.register import DatasetFiles, RegisteredBiLM, register_bilm
from pipelines.registry.tags import DEFAULT_NAME
from pipelines.serving.bilm_loader import LoadedBiLM
from pipelines.tracking.stage_runs import STAGE_TAG

STAGE = "import-weights"
IMPORT_OPTIONS_TAG = "elmo.import.options"
IMPORT_WEIGHTS_TAG = "elmo.import.weights"
IMPORT_SOFTMAX_TAG = "elmo.import.softmax"
IMPORT_VOCAB_TAG = "elmo.import.vocab"
TokenizerName = Literal["whitespace", "moses"]


def import_weights(
    options_file: str | Path,
    weight_file: str | Path,
    *,
    name: str = DEFAULT_NAME,
    softmax_file: str | Path | None = None,
    vocab_file: str | Path | None = None,
    alias: str | None = None,
    parent_run_id: str | None = None,
    tokenizer: TokenizerName = "whitespace",
) -> RegisteredBiLM:
    """Register a bilm-tf release as a new version of ``name``.

    Without ``alias`` the registry policy decides (``challenger``: no perplexity); with one the
    version is promoted to it explicitly. Bad files fail before anything is logged; an alias name
    MLflow refuses fails after registering, with the version left as the policy placed it.
    """
    if softmax_file is not None and vocab_file is None:
        raise ConfigError("a softmax needs its vocabulary (--vocab)", key="vocab_file")
    if tokenizer not in get_args(TokenizerName):
        raise ConfigError(f"{tokenizer!r} is not one of {get_args(TokenizerName)}", key="tokenizer")
    bilm = read_bilm_tf(options_file, weight_file, softmax_file=softmax_file)
    given = {
        IMPORT_OPTIONS_TAG: options_file,
        IMPORT_WEIGHTS_TAG: weight_file,
        IMPORT_SOFTMAX_TAG: softmax_file,
        IMPORT_VOCAB_TAG: vocab_file,
    }
    sources = {tag: str(Path(path).resolve()) for tag, path in given.items() if path is not None}
    with tempfile.TemporaryDirectory(prefix="elmo-import-") as scratch:
        root = Path(scratch)
        files = describe_import(root, sources, tokenizer, vocab_file, bilm.vocab_size)
        registered = register_bilm(
            LoadedBiLM(bilm, write_bilm_dir(bilm, root / "bilm")),
            files,
            evaluation=None,
            name=name,
            parent_run_id=parent_run_id,
            tags={STAGE_TAG: STAGE, **sources},  # the run says what it imported
            apply_policy=alias is None,
        )
    if alias is None:
        return registered
    try:
        previous = promote(name, registered.version, alias)
    except ConfigError:  # MLflow refused the alias name: the version gets the rule's alias
        apply_champion_policy(name, registered.version)
        raise
    decision = PromotionDecision(alias, "promoted explicitly", previous)
    return dataclasses.replace(registered, decision=decision)


def describe_import(
    target: Path,
    sources: dict[str, str],
    tokenizer: TokenizerName,
    vocab_file: str | Path | None,
    vocab_size: int | None,
) -> DatasetFiles:
    """Write the files the model carries in place of a dataset's: ``manifest.json`` (the import's
    source files by tag and the tokenizer the pyfunc model rebuilds) and, if given, ``vocab.txt``.

    A vocabulary whose size differs from the softmax's rows is a DataError: ids would be wrong.
    """
    vocab_path = vocab_sha256 = None
    if vocab_file is not None:
        vocab = read_vocab(str(vocab_file))
        if vocab_size is not None and len(vocab) != vocab_size:
            raise DataError(
                f"{len(vocab)} tokens, but the softmax has {vocab_size} rows", path=str(vocab_file)
            )
        text = vocab_text(vocab).encode("utf-8")
        vocab_path = target / "vocab.txt"
        vocab_path.write_bytes(text)
        vocab_sha256 = hashlib.sha256(text).hexdigest()
    description = {
        "source": "bilm-tf",
        "files": sources,
        "tokenizer": Tokenizer.from_manifest({"name": tokenizer}).describe(),
    }
    manifest = target / "manifest.json"
    manifest.write_text(json.dumps(description, indent=2), encoding="utf-8")
    manifest_sha256 = sha256_file(manifest)
    return DatasetFiles(
        url=f"bilm-tf:{sources[IMPORT_WEIGHTS_TAG]}",
        vocab=vocab_path,
        manifest=manifest,
        vocab_sha256=vocab_sha256,
        manifest_sha256=manifest_sha256,
    )
