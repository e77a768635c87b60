"""What an adapt run records in MLflow: curves, final scores and gain, the mix, the task model.

Metric names, inside one ``adapt`` run:

- per epoch (step = epoch): ``elmo/train_loss``, ``elmo/dev_<score>``, ``elmo/mix_weight_<j>``,
  ``elmo/gamma``; ``baseline/train_loss``, ``baseline/dev_<score>``;
- final, at the best epoch: ``elmo/best_dev_<score>``, ``elmo/test_<score>`` and the same under
  ``baseline/``; ``gain/dev_<metric>`` and ``gain/test_<metric>`` (ELMo − baseline) for the main
  metric and accuracy;
- the learned mix: ``mix_weight_<j>`` (softmax-normalised, layer 0 = the token layer) and
  ``gamma`` (``output_*`` too when the head also mixes ELMo at its output), drawn as the bar
  chart ``scalar_mix.png``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from importlib.metadata import version as package_version
from pathlib import Path

import mlflow
import torch

from elmo_core.tasks.trainer import TaskResult, main_metric
from pipelines.models import task_pyfunc
from pipelines.models.bilm_loader import LoadedBiLM

MIX_FIGURE = "scalar_mix.png"
MODEL_ARTIFACT = "task_model"


def prefixed_logger(prefix: str) -> Callable[[int, dict[str, float]], None]:
    """An ``epoch_callback`` for ``train_task`` logging ``<prefix>/<name>`` at step ``epoch``."""

    def log_epoch(epoch: int, metrics: dict[str, float]) -> None:
        mlflow.log_metrics({f"{prefix}/{name}": value for name, value in metrics.items()}, epoch)

    return log_epoch


def outcome_metrics(elmo: TaskResult, baseline: TaskResult) -> dict[str, float]:
    """Final scores of both models and the gain ELMo brings, by the names above."""
    metrics: dict[str, float] = {}
    for prefix, result in (("elmo", elmo), ("baseline", baseline)):
        metrics |= {f"{prefix}/best_dev_{k}": v for k, v in result.dev_metrics.items()}
        metrics |= {f"{prefix}/test_{k}": v for k, v in result.test_metrics.items()}
        metrics[f"{prefix}/best_epoch"] = float(result.best_epoch)
    for score in dict.fromkeys((main_metric(elmo.model.task), "accuracy")):
        for split, ours, theirs in (
            ("dev", elmo.dev_metrics, baseline.dev_metrics),
            ("test", elmo.test_metrics, baseline.test_metrics),
        ):
            if score in ours and score in theirs:
                metrics[f"gain/{split}_{score}"] = ours[score] - theirs[score]
    return metrics


def mix_metrics(elmo: TaskResult) -> dict[str, float]:
    """The learned mix weights and γ of each ELMo mix the model has."""
    metrics: dict[str, float] = {}
    for prefix, weights, gamma in (
        ("", elmo.mix_weights, elmo.gamma),
        ("output_", elmo.output_mix_weights, elmo.output_gamma),
    ):
        if weights is not None and gamma is not None:
            metrics |= {f"{prefix}mix_weight_{j}": w for j, w in enumerate(weights)}
            metrics[f"{prefix}gamma"] = gamma
    return metrics


def log_outcome(elmo: TaskResult, baseline: TaskResult) -> None:
    """Log the final scores, the gain and the learned mix into the active run."""
    mlflow.log_metrics(outcome_metrics(elmo, baseline) | mix_metrics(elmo))


def log_mix_figure(elmo: TaskResult) -> None:
    """A bar chart of the softmax-normalised layer weights, γ in the legend (``scalar_mix.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = [
        (name, weights, gamma)
        for name, weights, gamma in (
            ("input", elmo.mix_weights, elmo.gamma),
            ("output", elmo.output_mix_weights, elmo.output_gamma),
        )
        if weights is not None
    ]
    figure, axis = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / max(len(mixes), 1)
    for index, (name, weights, gamma) in enumerate(mixes):
        assert weights is not None
        positions = [layer + index * width for layer in range(len(weights))]
        axis.bar(positions, weights, width=width, label=f"{name} mix (γ = {gamma:.3f})")
    num_layers = len(mixes[0][1] or []) if mixes else 0
    axis.set_xticks([layer + 0.4 - width / 2 for layer in range(num_layers)])
    axis.set_xticklabels(["token"] + [f"LSTM {j}" for j in range(1, num_layers)])
    axis.set(title=f"{elmo.task}: learned scalar mix", ylabel="softmax(w)_j")
    axis.legend()
    figure.tight_layout()
    mlflow.log_figure(figure, MIX_FIGURE)
    plt.close(figure)


def log_task_model(
    elmo: TaskResult, source: LoadedBiLM, scratch: Path, version_tags: Mapping[str, object]
) -> int:
    """Log the ELMo task model as a pyfunc model and register it as ``elmo-<task>``.

    Explicit requirements and no input example, as for the biLM
    (:mod:`pipelines.registry.register`): either would make MLflow load the model once more
    while logging.
    """
    task_dir = task_pyfunc.save_task_model(elmo.model, scratch / "task", source.tokenizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*input example was not provided")
        info = mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT,
            python_model=task_pyfunc.__file__,
            artifacts={
                task_pyfunc.TASK_ARTIFACT: str(task_dir),
                task_pyfunc.BILM_ARTIFACT: str(source.model_dir),
            },
            signature=task_pyfunc.model_signature(elmo.model.task.type),
            pip_requirements=[
                f"elmo-platform=={package_version('elmo-platform')}",
                f"torch=={torch.__version__}",
                f"mlflow=={mlflow.__version__}",
            ],
        )
    tags = {key: str(value) for key, value in version_tags.items()}
    registered = mlflow.register_model(info.model_uri, f"elmo-{elmo.task}", tags=tags)
    return int(registered.version)
