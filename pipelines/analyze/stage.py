"""The analyze stage: the paper's §5 for any biLM, as one MLflow run.

Every biLM pass goes through the activation cache. The run holds one table of the analyses, which
``elmo analyze --compare RUN_A RUN_B`` lines up for two biLMs, and the headline as its description.
A finished run of the same biLM weights, tasks, senses, fractions and seeds is reused; one that
stopped resumes, its finished task runs kept under ``ELMO_HOME/cache/analysis-runs``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import torch

import elmo_core
import pipelines.analyze
import pipelines.common
from elmo_core.analysis.probe import flat_tag_ids, linear_probe
from elmo_core.analysis.sampling import check_fractions
from elmo_core.analysis.senses import (
    SenseExample,
    read_sense_splits,
    sense_probe,
    sense_sentences,
    target_vectors,
)
from elmo_core.analysis.task_runs import (
    DEFAULT_FRACTIONS,
    FinishedRuns,
    TaskAnalysis,
    analyze_task,
    head_width,
    num_runs,
)
from elmo_core.errors import ConfigError
from elmo_core.location import sha256_file
from elmo_core.tasks.activation_cache import ActivationCache, bilm_fingerprint
from elmo_core.tasks.readers import AnyDataset, task_labels
from elmo_core.tasks.seeds import DEFAULT_SEEDS
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.trainer import TaskSplit
from elmo_core.tasks.types import task_type
from pipelines.analyze.figures import efficiency_figure, layers_figure
from pipelines.analyze.runner import ray_runner
from pipelines.analyze.table import (
    CELLS_TABLE,
    MARKDOWN_FILE,
    TABLE_FILE,
    Row,
    compare_rows,
    from_json,
    headline,
    headline_metrics,
    markdown,
    probe_row,
    sense_row,
    task_rows,
    to_json,
)
from pipelines.common.code_version import code_version, source_files
from pipelines.common.console import console_progress
from pipelines.common.settings import elmo_home
from pipelines.common.task_data import cache_splits, check_tasks, read_splits, task_inputs
from pipelines.serving.bilm_loader import load_bilm, resolve_bilm
from pipelines.tracking.figures import log_figure
from pipelines.tracking.stage_runs import (
    DESCRIPTION_TAG,
    PARENT_RUN_ENV,
    REUSE_KEY_TAG,
    find_finished,
    location_name,
    report_progress,
    reuse_key,
    stage_run,
    stage_run_name,
    use_tracking,
)

SenseSplits = tuple[list[SenseExample], list[SenseExample]]


@dataclass
class AnalyzeResult:
    """The table's rows and the run that holds them."""

    run_id: str
    rows: list[Row] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)  # table.headline's lines
    reused: bool = False  # True when a finished run of the same analysis gave it


def analyze(
    tasks: Sequence[TaskConfig],
    bilm: str,
    *,
    bilm_options: str | None = None,
    senses: tuple[Path, Path] | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    every_layer: bool = False,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    console: bool = True,
) -> AnalyzeResult:
    """Every analysis of ``bilm`` on ``tasks`` (and ``senses``: train and test files);
    ``every_layer``: each layer alone trains even where the mix gains nothing on all of train;
    ``console``: a progress bar (a flow, which logs the run's progress, turns it off)."""
    datasets, sense_splits = check_inputs(tasks, senses, fractions, seeds)
    reference = resolve_bilm(bilm, bilm_options, options_key="bilm_options")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parent = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
    cache_dir = elmo_home() / "cache" / "activations"
    with tempfile.TemporaryDirectory(prefix="elmo-analyze-") as scratch:
        source = load_bilm(reference, Path(scratch) / "bilm-source").bilm.to(device)
        key = analysis_key(source, tasks, senses, fractions, seeds, every_layer)
        finished = _finished(key)
        if finished is not None:
            return finished
        runs = FinishedRuns(elmo_home() / "cache" / "analysis-runs" / key)
        with stage_run(
            "analyze",
            run_name=stage_run_name("analyze", location_name(bilm)),
            parent_run_id=parent,
            tags={**reference.tags, **(tags or {})},
        ) as run:
            mlflow.log_params(
                {
                    "bilm": reference.location,
                    "tasks": ",".join(task.name for task in tasks),
                    "fractions": ",".join(f"{f:g}" for f in fractions),
                    "seeds": ",".join(str(s) for s in seeds),
                    "every_layer": every_layer,
                    "head_dims": ",".join(f"{t.name}={head_width(t)}" for t in tasks),
                    "device": device,
                }
            )
            results, probes = _run_analyses(
                tasks,
                datasets,
                source,
                sense_splits,
                cache_dir,
                device,
                fractions,
                seeds,
                every_layer,
                console,
                runs,
            )
            rows = [row for result in results for row in task_rows(result)] + probes
            lines = headline(results, probes)
            _log_outcome(results, probes, rows, lines)
            mlflow.set_tag(REUSE_KEY_TAG, key)  # last: only a complete run is ever reused
    shutil.rmtree(runs.directory, ignore_errors=True)  # the finished MLflow run holds it all now
    return AnalyzeResult(run.info.run_id, rows, lines)


def analysis_key(
    bilm: torch.nn.Module,
    tasks: Sequence[TaskConfig],
    senses: tuple[Path, Path] | None,
    fractions: Sequence[float],
    seeds: Sequence[int],
    every_layer: bool,
) -> str:
    """What an analysis depends on: the biLM's weights, each task's config and data, the sense
    files, the fractions, the seeds, whether every layer trains alone and the code that
    analyzes."""
    code = source_files(elmo_core, pipelines.analyze, pipelines.common)
    return reuse_key(
        {
            "bilm": bilm_fingerprint(bilm),
            "tasks": [task_inputs(task) for task in tasks],
            "senses": [sha256_file(path) for path in senses] if senses is not None else None,
            "fractions": sorted(fractions),
            "seeds": list(seeds),
            "every_layer": every_layer,
            "code": code_version(code),
        }
    )


def _finished(key: str) -> AnalyzeResult | None:
    """The table and headline of the newest finished analysis of ``key``."""
    run = find_finished("analyze", key)
    if run is None:
        return None
    rows = from_json(mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/{TABLE_FILE}"))
    lines = run.data.tags.get(DESCRIPTION_TAG, "").splitlines()
    return AnalyzeResult(run.info.run_id, rows, lines, reused=True)


def check_inputs(
    tasks: Sequence[TaskConfig],
    senses: tuple[Path, Path] | None,
    fractions: Sequence[float],
    seeds: Sequence[int],
) -> tuple[dict[str, dict[str, AnyDataset]], SenseSplits | None]:
    """Read and check everything an analysis reads, before any work (a flow calls it before
    training): task files, each fraction against each task's labels, the sense files, the seeds.
    """
    check_tasks(tasks)
    if not seeds:
        raise ConfigError("at least one seed", key="seeds")
    datasets = {task.name: read_splits(task) for task in tasks}
    for task in tasks:
        check_fractions(list(datasets[task.name]["train"].examples), fractions, task.name)
    return datasets, read_sense_splits(*senses) if senses is not None else None


def _run_analyses(
    tasks: Sequence[TaskConfig],
    datasets: dict[str, dict[str, AnyDataset]],
    bilm: torch.nn.Module,
    sense_splits: SenseSplits | None,
    cache_dir: Path,
    device: str,
    fractions: Sequence[float],
    seeds: Sequence[int],
    every_layer: bool,
    console: bool,
    finished: FinishedRuns,
) -> tuple[list[TaskAnalysis], list[Row]]:
    """Each task's analysis and each probe's row, their figures logged; the task runs that
    ``finished`` holds are not trained again."""
    results, probes = [], []
    cached = {task.name: cache_splits(bilm, datasets[task.name], cache_dir) for task in tasks}
    counts = [_num_runs(cached[task.name], fractions, seeds) for task in tasks]
    total = sum(counts)
    with console_progress(total, "analyze", unit="run", enabled=console) as bar:
        done = 0

        def advance(line: str) -> None:
            nonlocal done
            done += 1
            bar.update(1)
            report_progress(line, done / total)

        for index, task in enumerate(tasks):
            splits = cached[task.name]
            result = analyze_task(
                task,
                splits,
                fractions=fractions,
                seeds=seeds,
                progress=advance,
                finished=finished,
                runner=ray_runner(splits),
                numbering=(sum(counts[:index]), total),
                every_layer=every_layer,
            )
            log_figure(efficiency_figure(result), f"efficiency_{task.name}.png")
            results.append(result)
            if task_type(task.type).probe:
                probes.append(_probe(task, splits, seeds[0], device))
    if sense_splits is not None:
        probes.append(_senses(bilm, sense_splits, cache_dir))
    log_figure(layers_figure(results, probes), "layers.png")
    return results, probes


def _num_runs(
    splits: Mapping[str, TaskSplit], fractions: Sequence[float], seeds: Sequence[int]
) -> int:
    activations = splits["train"].activations
    assert activations is not None  # cache_splits computes them
    return num_runs(fractions, seeds, activations.num_layers)


def _probe(task: TaskConfig, splits: dict[str, TaskSplit], seed: int, device: str) -> Row:
    """The linear probe per layer, trained on train and scored on test (dev without a test)."""
    train = splits["train"]
    evaluation = splits["test"] if "test" in splits else splits["dev"]
    label_ids = {tag: i for i, tag in enumerate(task_labels(task, train.dataset))}
    assert train.activations is not None and evaluation.activations is not None
    result = linear_probe(
        train.activations,
        flat_tag_ids(train.dataset, label_ids),
        evaluation.activations,
        flat_tag_ids(evaluation.dataset, label_ids),
        len(label_ids),
        seed=seed,
        device=device,
    )
    return probe_row(task.name, result)


def _senses(bilm: torch.nn.Module, splits: SenseSplits, cache_dir: Path) -> Row:
    cache = ActivationCache(cache_dir)
    train, test = (
        target_vectors(cache.get_or_build(bilm, sense_sentences(part), progress=False), part)
        for part in splits
    )
    result = sense_probe(train, [e.sense for e in splits[0]], test, [e.sense for e in splits[1]])
    return sense_row(result)


def _log_outcome(
    results: Sequence[TaskAnalysis], probes: Sequence[Row], rows: Sequence[Row], lines: list[str]
) -> None:
    """The table as artifacts (``analysis.md``, ``analysis.json``, and one MLflow table row per
    cell), the headline's few numbers as the run's metrics, and the headline as its description.
    Each task's learning curve is its ``efficiency_<task>.png``, both models against the share of
    training data: as metrics, MLflow would chart each model apart against "Step"."""
    mlflow.log_text(markdown(rows), MARKDOWN_FILE)
    mlflow.log_text(to_json(rows), TABLE_FILE)
    cells = [
        {"analysis": row.analysis, "column": column, "mean": cell.mean, "sd": cell.sd}
        for row in rows
        for column, cell in row.cells.items()
    ]
    mlflow.log_table({key: [cell[key] for cell in cells] for key in cells[0]}, CELLS_TABLE)
    mlflow.log_metrics(headline_metrics(results, probes))
    mlflow.set_tag(DESCRIPTION_TAG, "\n".join(lines))


def compare(first_run: str, second_run: str) -> str:
    """The tables of two analyze runs side by side."""
    use_tracking()
    tables = [
        from_json(mlflow.artifacts.load_text(f"runs:/{run}/{TABLE_FILE}"))
        for run in (first_run, second_run)
    ]
    return compare_rows(tables[0], tables[1], (first_run[:8], second_run[:8]))
