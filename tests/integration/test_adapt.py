"""adapt on real Ray and a real SQLite MLflow store: parallel jobs, runs, metrics, models."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from mlflow import MlflowClient

from elmo_core.errors import ConfigError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import save_bilm
from elmo_core.presets import tiny
from elmo_core.tasks import load_task_config
from elmo_core.text.tokenize import WhitespaceTokenizer
from pipelines.adapt import stage as adapt_stage
from pipelines.common import tracking
from pipelines.models import bilm_loader as bilm_source
from pipelines.registry.register import DatasetFiles, log_bilm_model

pytestmark = pytest.mark.integration

NAMES = ["Anna", "Bob", "Carla"]
PLACES = ["Rome", "Oslo", "Lima"]
TRAINING = "{epochs: 2, batch_size: 8, lr: 0.01, patience: null}"


def _write_tagging(root: Path) -> Path:
    """``Name went to Place .`` with B-PER / B-LOC tags, IOB2, ``word tag`` lines."""
    sentences = [
        [(NAMES[i % 3], "B-PER"), ("went", "O"), ("to", "O"), (PLACES[i // 3 % 3], "B-LOC")]
        + [(".", "O")]
        for i in range(18)
    ]
    for split, part in (("train", sentences[:12]), ("dev", sentences[12:15])):
        text = "\n".join("".join(f"{w} {t}\n" for w, t in s) for s in part)
        (root / f"tags.{split}").write_text(text)
    (root / "tags.yaml").write_text(
        "name: tagger\ntype: tagging\nformat: conll2003\ntrain: tags.train\ndev: tags.dev\n"
        "test: tags.dev\nreader: {tag_scheme: iob2}\nhead: {hidden_dim: 8}\n"
        f"training: {TRAINING}\n"
    )
    return root / "tags.yaml"


def _write_classification(root: Path) -> Path:
    """``where is Place ?`` → LOC, ``who is Name ?`` → HUM."""
    lines = [f"LOC where is {p} ?" for p in PLACES] + [f"HUM who is {n} ?" for n in NAMES]
    (root / "questions.train").write_text("\n".join(lines * 2) + "\n")
    (root / "questions.dev").write_text("LOC where is Rome ?\nHUM who is Bob ?\n")
    (root / "questions.yaml").write_text(
        "name: questions\ntype: classification\nformat: label_text\ntrain: questions.train\n"
        "dev: questions.dev\ntest: questions.dev\nhead: {hidden_dim: 8}\n"
        f"training: {TRAINING}\n"
    )
    return root / "questions.yaml"


def _register_bilm(model_dir: Path, root: Path) -> None:
    """``elmo-bilm`` version 1 with alias ``champion``; manifest: whitespace tokenizer."""
    (root / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n")
    (root / "manifest.json").write_text(json.dumps({"tokenizer": WhitespaceTokenizer().describe()}))
    dataset = DatasetFiles("test", root / "vocab.txt", root / "manifest.json", "-", "-")
    with tracking.stage_run("register", run_name="register-test"):
        info = log_bilm_model(model_dir, dataset)
    version = mlflow.register_model(info.model_uri, "elmo-bilm")
    MlflowClient().set_registered_model_alias("elmo-bilm", "champion", version.version)


@pytest.fixture(scope="module")
def adapted(ray_session, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Two tasks adapted in parallel on a checkpoint dir, then one in a flow on ``@champion``."""
    root = tmp_path_factory.mktemp("adapt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELMO_HOME", str(root / "home"))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv(tracking.PARENT_RUN_ENV, raising=False)
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        patch.chdir(root)
        torch.manual_seed(0)
        model_dir = save_bilm(BiLM(tiny(), 100), root / "bilm")
        configs = [_write_tagging(root), _write_classification(root)]
        tasks = [load_task_config(path) for path in configs]
        standalone = adapt_stage.adapt(tasks, str(model_dir))
        cache = root / "home" / "cache" / "activations"
        entries_after_first = sorted(p.name for p in cache.iterdir())
        _register_bilm(model_dir, root)
        with tracking.stage_run("flow", run_name="flow-test") as parent:
            pass
        nested = adapt_stage.adapt(
            tasks[1:],
            "models:/elmo-bilm@champion",
            parent_run_id=parent.info.run_id,
            tags={"elmo.flow": "test"},
        )
        uri = tracking.use_tracking()
        yield SimpleNamespace(
            root=root,
            uri=uri,
            client=MlflowClient(uri),
            model_dir=model_dir,
            configs=configs,
            tasks=tasks,
            standalone=standalone,
            nested=nested[0],
            parent_id=parent.info.run_id,
            cache=cache,
            entries_after_first=entries_after_first,
        )


def test_jobs_run_in_parallel_as_standalone_runs_tagged_with_the_bilm_path(adapted) -> None:
    runs = [adapted.client.get_run(result.run_id) for result in adapted.standalone]
    assert [result.task for result in adapted.standalone] == ["tagger", "questions"]
    for run, task in zip(runs, ["tagger", "questions"], strict=True):
        assert run.info.status == "FINISHED" and run.info.run_name == f"adapt-{task}"
        assert run.data.tags[tracking.STAGE_TAG] == "adapt"
        assert run.data.tags[bilm_source.PATH_TAG] == str(adapted.model_dir)
        assert run.data.tags[adapt_stage.TASK_TAG] == task
        assert "GloVe" in run.data.tags[adapt_stage.BASELINE_TAG]
        assert "mlflow.parentRunId" not in run.data.tags
        assert run.data.params["training.epochs"] == "2"  # the task config, logged
    first, second = runs
    assert first.info.start_time < second.info.end_time
    assert second.info.start_time < first.info.end_time  # the two Ray tasks overlapped


def test_runs_hold_epoch_curves_scores_with_and_without_elmo_gain_and_mix(adapted) -> None:
    for result, metric in zip(adapted.standalone, ["f1", "accuracy"], strict=True):
        assert result.metric == metric
        metrics = adapted.client.get_run(result.run_id).data.metrics
        for prefix in ("elmo", "baseline"):
            history = adapted.client.get_metric_history(result.run_id, f"{prefix}/train_loss")
            assert [point.step for point in history] == [1, 2]
            assert metrics[f"{prefix}/test_{metric}"] == getattr(result, f"{prefix}_test")[metric]
            assert f"{prefix}/best_dev_{metric}" in metrics
        gain = result.elmo_test[metric] - result.baseline_test[metric]
        assert metrics[f"gain/test_{metric}"] == pytest.approx(gain)
        assert result.gain[f"test_{metric}"] == pytest.approx(gain)
        weights = [metrics[f"mix_weight_{j}"] for j in range(3)]
        assert weights == pytest.approx(result.mix_weights) and sum(weights) == pytest.approx(1)
        assert metrics["gamma"] == pytest.approx(result.gamma)
        assert len(adapted.client.get_metric_history(result.run_id, "elmo/gamma")) == 2


def test_each_run_logs_the_scalar_mix_bar_chart(adapted) -> None:
    for result in adapted.standalone:
        names = [item.path for item in adapted.client.list_artifacts(result.run_id)]
        assert "scalar_mix.png" in names


def test_each_task_model_is_registered_as_elmo_task_with_scores_and_bilm_tags(adapted) -> None:
    for result in adapted.standalone:
        assert (result.model_name, result.model_version) == (f"elmo-{result.task}", 1)
        version = adapted.client.get_model_version(result.model_name, "1")
        assert version.run_id == result.run_id
        assert version.tags[bilm_source.PATH_TAG] == str(adapted.model_dir)
        assert float(version.tags[f"elmo/test_{result.metric}"]) == pytest.approx(
            result.elmo_test[result.metric]
        )


def test_inside_a_flow_the_run_is_a_child_tagged_with_the_registered_version(adapted) -> None:
    result = adapted.nested
    run = adapted.client.get_run(result.run_id)
    assert run.data.tags["mlflow.parentRunId"] == adapted.parent_id
    assert run.data.tags[bilm_source.MODEL_TAG] == "elmo-bilm"
    assert run.data.tags[bilm_source.VERSION_TAG] == "1"
    assert run.data.tags["elmo.flow"] == "test"
    assert result.model_uri == "models:/elmo-questions/2"


def test_activations_are_computed_once_per_bilm_and_split(adapted) -> None:
    assert len(adapted.entries_after_first) == 4  # 2 tasks × (train, dev = test)
    # The registered biLM holds the same weights: the nested job reused every entry.
    assert sorted(p.name for p in adapted.cache.iterdir()) == adapted.entries_after_first


def test_registered_models_label_raw_sentences_in_a_fresh_process(adapted, fresh_python) -> None:
    script = (
        "import json, mlflow, pandas as pd\n"
        "out = {}\n"
        "tagger = mlflow.pyfunc.load_model('models:/elmo-tagger/1')\n"
        "tags = tagger.predict(pd.DataFrame({'sentence': ['Anna went to Oslo.']}))\n"
        "out['tagger'] = [tags['tokens'][0], tags['tags'][0]]\n"
        "for version in (1, 2):\n"
        "    model = mlflow.pyfunc.load_model(f'models:/elmo-questions/{version}')\n"
        "    labels = model.predict(pd.DataFrame({'sentence': ['where is Rome?']}))\n"
        "    out[version] = [labels['tokens'][0], labels['label'][0]]\n"
        "print(json.dumps(out))\n"
    )
    printed = fresh_python(script, adapted.uri, adapted.root.parent)
    tokens, tags = printed["tagger"]
    assert tokens == ["Anna", "went", "to", "Oslo", "."]  # no biLM tokenizer known: Moses
    assert len(tags) == 5 and set(tags) <= {"B-PER", "B-LOC", "O"}
    assert printed["1"][0] == ["where", "is", "Rome", "?"]
    assert printed["2"][0] == ["where", "is", "Rome?"]  # the registered biLM's tokenizer
    assert {printed["1"][1], printed["2"][1]} <= {"LOC", "HUM"}


def test_a_bad_bilm_path_fails_before_any_job(adapted, tmp_path) -> None:
    with pytest.raises(WeightsError, match="no such checkpoint directory"):
        adapt_stage.adapt(adapted.tasks, str(tmp_path / "missing"))
    with pytest.raises(WeightsError, match="no such registered model version"):
        adapt_stage.adapt(adapted.tasks, "models:/elmo-bilm/7")


def test_a_bad_task_config_is_one_line_naming_its_key(adapted, tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(adapted.configs[1].read_text() + "hed: {}\n")
    status = adapt_stage.main(["--task", str(bad), "--bilm", str(adapted.model_dir)])
    assert status == 2
    assert "hed" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="two tasks named questions"):
        adapt_stage.adapt([adapted.tasks[1]] * 2, str(adapted.model_dir))
