"""Models logged to MLflow: made from the run that trained them, at the step they hold, with the
metrics that are theirs and the data they learnt from; registered quietly.

MLflow's ``log_model`` links to the model every metric its run logged at the model's step: at
step 0 (its default) that is the run's first system metrics sample, which the model's page then
shows as its own; at the model's real step, whichever system sample has that number. So the
model is made here from its run and logged where no run is active (MLflow's active run is per
thread), and then given its step and its own metrics explicitly.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import mlflow
from mlflow.entities import LoggedModelOutput, Metric, Run
from mlflow.models.model import ModelInfo
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE, MLFLOW_USER

DATA_CONTEXT_TAG = "mlflow.data.context"


def log_model_at(
    name: str,
    source_run_id: str,
    step: int,
    log: Callable[[str], ModelInfo],
    *,
    description: str,
    own_metrics: Sequence[str] = (),
) -> ModelInfo:
    """The model ``name`` of the run ``source_run_id``, as it was at ``step``, described on its
    page by ``description``: ``log(model_id)`` logs its files into the model made here (with no
    active run, so MLflow links nothing), and its metrics are the run's at ``step`` whose keys
    start with one of ``own_metrics``, each marked as measured on the run's training dataset
    (the model page's "Datasets used")."""
    client = MlflowClient()
    source = client.get_run(source_run_id)
    model = client.create_logged_model(
        source.info.experiment_id,
        name=name,
        source_run_id=source_run_id,
        tags=logged_model_tags(source) | {MLFLOW_RUN_NOTE: description},
        params=dict(source.data.params),
    )
    with ThreadPoolExecutor(1, thread_name_prefix="log-model") as pool:
        info = pool.submit(log, model.model_id).result()
    client.log_outputs(source_run_id, [LoggedModelOutput(model.model_id, step)])
    dataset = training_dataset(source)
    own = [
        Metric(
            point.key,
            point.value,
            point.timestamp,
            point.step,
            run_id=source_run_id,
            model_id=model.model_id,
            dataset_name=dataset[0] if dataset else None,
            dataset_digest=dataset[1] if dataset else None,
        )  # fmt: skip
        for key in source.data.metrics
        if key.startswith(tuple(own_metrics))
        for point in client.get_metric_history(source_run_id, key)
        if point.step == step
    ]
    if own:
        client.log_batch(source_run_id, metrics=own)
    return info


def training_dataset(run: Run) -> tuple[str, str] | None:
    """The name and digest of the dataset ``run`` trained on (its input whose context names
    training), if it logged one."""
    for entry in run.inputs.dataset_inputs if run.inputs else []:
        contexts = [tag.value for tag in entry.tags if tag.key == DATA_CONTEXT_TAG]
        if any("train" in context for context in contexts):
            return entry.dataset.name, entry.dataset.digest
    return None


def logged_model_tags(run: Run) -> dict[str, str]:
    """The user and source tags of ``run``, for a model it logs: MLflow would tag the model
    with the logging process's own (Ray's worker script, no commit)."""
    return {
        key: value
        for key, value in run.data.tags.items()
        if key == MLFLOW_USER or key.startswith("mlflow.source.")
    }


def register_model(model_uri: str, name: str, tags: Mapping[str, str]) -> int:
    """Register ``model_uri`` as a new version of ``name``; its number. MLflow's own call prints
    "Successfully registered model" and "Created version" on stderr beside the stage's line that
    says the same, so its stderr is taken for the call (its warnings go to logging, unaffected)."""
    with contextlib.redirect_stderr(io.StringIO()):
        return int(mlflow.register_model(model_uri, name, tags=dict(tags)).version)
