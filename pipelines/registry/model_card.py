"""What a registered model says about itself: a description showing how to call it, and its tags.

Every model of the platform publishes through :func:`publish_card`, so all read alike; the card's
example input is the one logged with the model, so the call shown is one that ran.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd
from mlflow import MlflowClient

from elmo_core.config import ModelConfig
from elmo_core.presets import PRESETS
from pipelines.common.handoff import CHECKPOINT_STEP_TAG, CHECKPOINT_TAG
from pipelines.registry.tags import (
    BACKWARD_PERPLEXITY_TAG,
    CHAMPION,
    DATASET_TAG,
    FORWARD_PERPLEXITY_TAG,
    HELDOUT_SPLIT_TAG,
    KIND_TAG,
    MANIFEST_HASH_TAG,
    PERPLEXITY_TAG,
    PREDICTED_TOKENS_TAG,
    PRESET_TAG,
    SIZE_TAG,
)
from pipelines.serving import bilm_pyfunc
from pipelines.tracking.stage_runs import use_tracking

BILM_EXAMPLE = {bilm_pyfunc.SENTENCE_COLUMN: "The cat sat on the mat."}


@dataclass(frozen=True)
class ModelCard:
    """A registered model's description, field by field; :meth:`markdown` writes it."""

    name: str
    summary: str  # what the model is, in a sentence
    uri: str  # what to load: models:/<name>@champion, or a version
    example: Mapping[str, str]  # input column → one value, e.g. {"sentence": "..."}
    outputs: str  # the output columns and what they hold
    tags: Mapping[str, str]  # model-level tags (elmo.kind, elmo.task)

    def markdown(self) -> str:
        """Four lines of prose around the call: summary, code, output columns."""
        columns = ", ".join(f"{json.dumps(k)}: [{json.dumps(v)}]" for k, v in self.example.items())
        return "\n".join(
            [
                f"**{self.name}**: {self.summary}",
                "",
                "```python",
                "import mlflow, pandas as pd",
                f'model = mlflow.pyfunc.load_model("{self.uri}")',
                f"model.predict(pd.DataFrame({{{columns}}}))",
                "```",
                f"Output columns: {self.outputs}.",
            ]
        )


def example_frame(example: Mapping[str, str]) -> pd.DataFrame:
    """A card's example as the one-row frame ``predict`` takes: the model's input example."""
    return pd.DataFrame({column: [value] for column, value in example.items()})


def publish_card(
    card: ModelCard, version: int, version_description: str, client: MlflowClient | None = None
) -> None:
    """Write the model's description and tags, and the version's own short description.

    The model-level ones are rewritten at every registration: they describe the newest version.
    """
    client = client or MlflowClient(use_tracking())
    client.update_registered_model(card.name, card.markdown())
    for key, value in card.tags.items():
        client.set_registered_model_tag(card.name, key, value)
    client.update_model_version(card.name, str(version), version_description)


def architecture_tags(config: ModelConfig) -> dict[str, str]:
    """``elmo.preset``: the preset with the same char CNN and LSTMs (dropout and sampling only
    matter in training), else ``custom``; ``elmo.size``: ``2x4096_512`` as the releases say."""
    preset = next(
        (
            name
            for name, make in PRESETS.items()
            if (make().char_cnn, make().lstm) == (config.char_cnn, config.lstm)
        ),
        "custom",
    )
    lstm = config.lstm
    return {
        PRESET_TAG: preset,
        SIZE_TAG: f"{lstm.num_layers}x{lstm.cell_dim}_{lstm.projection_dim}",
    }


def bilm_card(name: str) -> ModelCard:
    """What every version of a biLM model is and how to embed with it."""
    return ModelCard(
        name=name,
        summary=(
            "an ELMo biLM (Peters et al. 2018): raw sentences in, the vectors of every layer of "
            "each token out. `@champion` has the lowest heldout perplexity (docs/registry.md)"
        ),
        uri=f"models:/{name}@{CHAMPION}",
        example=BILM_EXAMPLE,
        outputs=(
            f"`{bilm_pyfunc.TOKENS_COLUMN}` (the tokens read), `{bilm_pyfunc.EMBEDDINGS_COLUMN}` "
            '(layers × tokens × 2·projection; `params={"output": "mix"}` gives one vector per '
            "token)"
        ),
        tags={KIND_TAG: "bilm"},
    )


def bilm_version_description(
    version_tags: Mapping[str, str], runs: Mapping[str, str] | None = None
) -> str:
    """One line on the version, its result first (the model page's versions table shows the
    line's first few characters): its heldout perplexity, its size, where it came from (which
    model of its training run, when it says), what it was scored on; ``runs``: what happened to
    it in which run (``trained`` → a link to the training run). It says what the version's few
    tags leave out (``BILM_VERSION_TAGS``)."""
    size, preset, data = (version_tags[tag] for tag in (SIZE_TAG, PRESET_TAG, DATASET_TAG))
    score = "no heldout perplexity"
    if PERPLEXITY_TAG in version_tags:
        score = (
            f"{float(version_tags[PERPLEXITY_TAG]):.2f} heldout perplexity (forward "
            f"{float(version_tags[FORWARD_PERPLEXITY_TAG]):.2f}, backward "
            f"{float(version_tags[BACKWARD_PERPLEXITY_TAG]):.2f})"
        )
    lines = [f"{score}: {size} biLM ({preset}) on {data}"]
    if CHECKPOINT_TAG in version_tags:
        step = version_tags.get(CHECKPOINT_STEP_TAG)
        at = "" if step is None else f" (step {step})"
        lines.append(f"its training run's {version_tags[CHECKPOINT_TAG]} model{at}")
    if HELDOUT_SPLIT_TAG in version_tags:
        tokens = int(version_tags[PREDICTED_TOKENS_TAG])
        lines.append(f"scored on split {version_tags[HELDOUT_SPLIT_TAG]} ({tokens:,} predictions)")
    lines += [f"{what} in run {link}" for what, link in (runs or {}).items()]
    if MANIFEST_HASH_TAG in version_tags:
        lines.append(f"dataset manifest sha256 {version_tags[MANIFEST_HASH_TAG][:12]}…")
    text = "; ".join(lines) + "."
    return text[0].upper() + text[1:]
