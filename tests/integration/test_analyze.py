"""analyze on a real SQLite MLflow store: one run with the table, metrics and figures; compare."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from mlflow import MlflowClient

from elmo_core.errors import ConfigError, DataError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.tasks import load_task_config
from pipelines.analyze import cli as analyze_cli
from pipelines.analyze import stage as analyze_stage
from pipelines.tracking import stage_runs

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SENSES = EXAMPLES / "analysis" / "data"
FRACTIONS, SEEDS = (0.5, 1.0), (0, 1)


def _write_tagging(root: Path) -> Path:
    """``Name went to Place .`` with B-PER / B-LOC tags, IOB2, ``word tag`` lines."""
    names, places = ["Anna", "Bob", "Carla"], ["Rome", "Oslo", "Lima"]
    sentences = [
        [(names[i % 3], "B-PER"), ("went", "O"), ("to", "O"), (places[i // 3 % 3], "B-LOC")]
        + [(".", "O")]
        for i in range(18)
    ]
    for split, part in (("train", sentences[:12]), ("dev", sentences[12:])):
        text = "\n".join("".join(f"{w} {t}\n" for w, t in s) for s in part)
        (root / f"tags.{split}").write_text(text)
    (root / "tags.yaml").write_text(
        "name: tagger\ntype: tagging\nformat: conll2003\ntrain: tags.train\ndev: tags.dev\n"
        "test: tags.dev\nreader: {tag_scheme: iob2}\nhead: {hidden_dim: 8}\n"
        "training: {epochs: 2, batch_size: 8, lr: 0.01, patience: null}\n"
    )
    return root / "tags.yaml"


@pytest.fixture(scope="module")
def analyzed(isolated_home, tmp_path_factory):  # type: ignore[no-untyped-def]
    """One analysis of a tiny biLM on a tagging task and the shipped sense set, each layer alone
    trained (a tiny biLM's mix may gain nothing), then a second of another biLM, for the
    comparison."""
    root = tmp_path_factory.mktemp("analyze")
    with isolated_home(root):
        task = load_task_config(_write_tagging(root))
        torch.manual_seed(0)
        first_bilm = write_bilm_dir(BiLM(tiny(), 100), root / "bilm-a")
        torch.manual_seed(1)
        second_bilm = write_bilm_dir(BiLM(tiny(), 100), root / "bilm-b")
        senses = (SENSES / "senses.train.tsv", SENSES / "senses.test.tsv")
        runs = [
            analyze_stage.analyze(
                [task],
                str(bilm),
                senses=senses,
                fractions=FRACTIONS,
                seeds=SEEDS,
                every_layer=bilm == first_bilm,
            )
            for bilm in (first_bilm, second_bilm)
        ]
        uri = stage_runs.use_tracking()
        yield SimpleNamespace(
            root=root, task=task, runs=runs, client=MlflowClient(uri), bilm=first_bilm
        )


def test_one_finished_run_holds_the_table_figures_and_a_metric_per_cell(analyzed) -> None:
    result = analyzed.runs[0]
    run = analyzed.client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[stage_runs.STAGE_TAG] == "analyze"
    assert run.info.run_name == "analyze-bilm-a"  # <stage>-<the biLM it analyzed>
    assert run.data.params["head_dims"] == "tagger=8"  # its config's width, not the analysis's 64
    artifacts = {a.path for a in analyzed.client.list_artifacts(result.run_id)}
    assert {"analysis.md", "analysis.json", "efficiency_tagger.png", "layers.png"} <= artifacts
    names = [row.analysis for row in result.rows]
    assert names == [
        "tagger test_f1, elmo by train fraction",
        "tagger test_f1, baseline by train fraction",
        "tagger test_f1, per layer",
        "tagger learned mix weights (mean over 2 seeds, all of train, best epoch)",
        "tagger test_f1, ELMo placement",
        "tagger linear probe accuracy",
        "word sense, nearest centroid accuracy",
    ]
    assert list(result.rows[0].cells) == ["50%", "100%"]
    assert list(result.rows[2].cells) == ["layer 0", "layer 1", "layer 2", "mix"]
    assert sum(cell.mean for cell in result.rows[3].cells.values()) == pytest.approx(1.0)
    # The metrics are the headline's few; the learning curve is a figure, not a step chart.
    metrics = {k: v for k, v in run.data.metrics.items() if not k.startswith("system/")}
    assert set(metrics) == {
        "tagger/gain_in_test_f1_at_best_fraction",
        "tagger/test_f1_of_best_single_layer",
        "tagger_linear_probe_accuracy_of_best_layer",
        "word_sense_nearest_centroid_accuracy_of_best_layer",
    }
    figures = {item.path for item in analyzed.client.list_artifacts(result.run_id)}
    assert {"efficiency_tagger.png", "layers.png"} <= figures
    cells = mlflow.load_table("analysis_cells.json", run_ids=[result.run_id])
    assert len(cells) == sum(len(row.cells) for row in result.rows)
    assert run.data.tags[stage_runs.DESCRIPTION_TAG] == "\n".join(result.headline)
    logged = json.loads(mlflow.artifacts.load_text(f"runs:/{result.run_id}/analysis.json"))
    assert [row["analysis"] for row in logged] == names
    tagger, probe, senses, note = result.headline
    alone = ("each layer alone: best layer ", "each layer alone: none beyond the seeds' spread: ")
    assert tagger.startswith("tagger: with ") and any(verdict in tagger for verdict in alone)
    assert note == "(± is the sample standard deviation over the 2 seeds)"
    verdicts = ("best layer ", "no layer clears its baseline", "saturated")
    assert probe.startswith("tagger linear probe accuracy: ") and "majority" in probe
    assert any(verdict in probe for verdict in verdicts) and "(train " in probe
    assert senses.startswith("word sense, nearest centroid accuracy: ") and "MFS" in senses


def test_the_layer_alone_runs_read_one_layer_and_the_mix_runs_read_all(analyzed) -> None:
    per_layer = analyzed.runs[0].rows[2].cells
    mix_runs = analyzed.runs[0].rows[0].cells["100%"]
    assert per_layer["mix"] == mix_runs  # the full-data ELMo run is shared, not run twice


def test_compare_puts_two_biLMs_side_by_side(analyzed) -> None:
    first, second = (run.run_id for run in analyzed.runs)
    text = analyze_stage.compare(first, second)
    assert text.splitlines()[0].endswith(f"{first[:8]} → {second[:8]}")
    assert "word sense, nearest centroid accuracy" in text and "→" in text.splitlines()[-1]


def test_bad_input_fails_before_the_biLM_loads(analyzed, tmp_path) -> None:
    bad = tmp_path / "senses.test.tsv"
    bad.write_text("bank%river\t9\tthe bank .\n")
    senses = (SENSES / "senses.train.tsv", bad)
    with pytest.raises(DataError, match=r"senses.test.tsv:1: word index 9 is out of range"):
        analyze_stage.analyze([analyzed.task], "/nowhere", senses=senses, fractions=FRACTIONS)
    tiny_task = tmp_path / "tags.yaml"
    shutil.copy(analyzed.root / "tags.yaml", tiny_task)
    for split in ("train", "dev"):
        shutil.copy(analyzed.root / f"tags.{split}", tmp_path / f"tags.{split}")
    with pytest.raises(DataError, match="tagger': fraction 0.01"):
        analyze_stage.analyze([load_task_config(tiny_task)], "/nowhere", fractions=(0.01,))
    with pytest.raises(ConfigError, match="seed"):
        analyze_stage.analyze([analyzed.task], "/nowhere", fractions=FRACTIONS, seeds=())


def test_the_same_analysis_again_reuses_its_run_and_other_settings_run_anew(
    analyzed, capsys
) -> None:
    first = analyzed.runs[0]
    senses = (SENSES / "senses.train.tsv", SENSES / "senses.test.tsv")
    again = analyze_stage.analyze(
        [analyzed.task],
        str(analyzed.bilm),
        senses=senses,
        fractions=FRACTIONS[::-1],
        seeds=SEEDS,
        every_layer=True,
    )
    assert again.reused and not first.reused
    assert (again.run_id, again.rows, again.headline) == (first.run_id, first.rows, first.headline)
    # A finished analysis keeps no per-run outcomes (they resume a stopped one): its run has all.
    assert not list((analyzed.root / "home" / "cache" / "analysis-runs").glob("*"))
    command = ["--task", str(analyzed.root / "tags.yaml"), "--bilm", str(analyzed.bilm)]
    command += ["--senses-train", str(senses[0]), "--senses-test", str(senses[1])]
    command += ["--fractions", "0.5,1", "--seeds", "0,1", "--every-layer"]
    assert analyze_cli.main(command) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"reused analyze run {first.run_id}: ")
    assert first.headline[0] in printed

    other = analyze_stage.analyze([analyzed.task], str(analyzed.bilm), fractions=(1.0,), seeds=(0,))
    assert not other.reused and other.run_id not in {run.run_id for run in analyzed.runs}
