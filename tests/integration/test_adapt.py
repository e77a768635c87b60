"""adapt on real Ray and a real SQLite MLflow store: parallel jobs, runs, metrics, models."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from mlflow import MlflowClient

from elmo_core.errors import ConfigError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.tasks import load_task_config
from elmo_core.tasks.seeds import Scores
from elmo_core.text.tokenize import WhitespaceTokenizer
from pipelines.adapt import cli as adapt_cli
from pipelines.adapt import stage as adapt_stage
from pipelines.adapt.task_records import MODELS, SEEDS_TABLE
from pipelines.registry.register import DatasetFiles, log_bilm_model
from pipelines.serving import bilm_loader as bilm_source
from pipelines.tracking import stage_runs

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
    with stage_runs.stage_run("register", run_name="register-test"):
        info = log_bilm_model(model_dir, dataset, "elmo-bilm")
    version = mlflow.register_model(info.model_uri, "elmo-bilm")
    MlflowClient().set_registered_model_alias("elmo-bilm", "champion", version.version)


def _adapt_executions() -> set[tuple[str, float]]:
    """``(worker, start µs)`` of each ``run_adapt_job`` execution the module's Ray recorded
    (``ray.timeline``: the task events its workers report)."""
    import ray

    return {
        (event["tid"], event["ts"])
        for event in ray.timeline()
        if event.get("cat") == "task::run_adapt_job"
    }


@pytest.fixture(scope="module")
def adapted(ray_session, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Two tasks adapted in parallel on a checkpoint dir, then one in a flow on ``@champion``."""
    root = tmp_path_factory.mktemp("adapt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELMO_HOME", str(root / "home"))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv(stage_runs.PARENT_RUN_ENV, raising=False)
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        patch.chdir(root)
        torch.manual_seed(0)
        model_dir = write_bilm_dir(BiLM(tiny(), 100), root / "bilm")
        configs = [_write_tagging(root), _write_classification(root)]
        tasks = [load_task_config(path) for path in configs]
        earlier = _adapt_executions()
        standalone = adapt_stage.adapt(tasks, str(model_dir))
        standalone_done_us = time.time() * 1e6
        cache = root / "home" / "cache" / "activations"
        entries_after_first = sorted(p.name for p in cache.iterdir())
        _register_bilm(model_dir, root)
        with stage_runs.stage_run("flow", run_name="flow-test") as parent:
            pass
        nested = adapt_stage.adapt(
            tasks[1:],
            "models:/elmo-bilm@champion",
            seeds=[5],
            parent_run_id=parent.info.run_id,
            tags={"elmo.flow": "test"},
        )
        uri = stage_runs.use_tracking()
        # By now (the nested job took seconds) the standalone jobs' events have been reported.
        standalone_executions = [
            execution
            for execution in _adapt_executions() - earlier
            if execution[1] < standalone_done_us
        ]
        yield SimpleNamespace(
            root=root,
            uri=uri,
            client=MlflowClient(uri),
            model_dir=model_dir,
            configs=configs,
            tasks=tasks,
            standalone=standalone,
            standalone_executions=standalone_executions,
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
        assert run.data.tags[stage_runs.STAGE_TAG] == "adapt"
        assert run.data.tags[bilm_source.PATH_TAG] == str(adapted.model_dir)
        assert run.data.tags[adapt_stage.TASK_TAG] == task
        assert "GloVe" in run.data.tags[adapt_stage.BASELINE_TAG]
        description = run.data.tags[stage_runs.DESCRIPTION_TAG]  # the task model's Source Run
        assert description.startswith(f"Adapted the frozen biLM `{adapted.model_dir}` to {task} ")
        # the task model as a link that stays in the model-training view
        assert f"→ [models:/elmo-{task}/" in description
        assert f"](#/models/elmo-{task}/versions/" in description
        assert description.endswith(f"{stage_runs.TRAINING_VIEW})")
        assert "mlflow.parentRunId" not in run.data.tags
        assert run.data.params["training.epochs"] == "2"  # the task config, logged
    # Submitted together to a 2-CPU Ray, the two jobs ran as two tasks in two worker processes.
    workers = [worker for worker, _ in adapted.standalone_executions]
    assert len(workers) == 2 and len(set(workers)) == 2, adapted.standalone_executions


def test_a_run_names_its_source_and_commit_not_the_ray_worker(adapted) -> None:
    for result in adapted.standalone:
        tags = adapted.client.get_run(result.run_id).data.tags
        assert tags["mlflow.source.name"] == "pipelines.adapt"
        assert tags["mlflow.source.type"] == "LOCAL"
        assert tags.get("mlflow.source.git.commit") == stage_runs.git_commit()  # None: no checkout
    nested = adapted.client.get_run(adapted.nested.run_id).data.tags
    assert nested["mlflow.source.type"] == "JOB"  # inside a flow


def test_a_run_samples_system_metrics_from_its_start_in_its_ray_worker(adapted) -> None:
    for result in adapted.standalone:
        history = adapted.client.get_metric_history(
            result.run_id, "system/cpu_utilization_percentage"
        )
        run = adapted.client.get_run(result.run_id).info
        assert len(history) >= 2  # from its start to its end, however short the run
        first = min(m.timestamp for m in history) - run.start_time
        assert first <= max(5_000, (run.end_time - run.start_time) / 2)  # not minutes late
        assert any(m.value > 0 for m in history)  # not psutil's first reading, always 0


def test_params_are_only_the_config_fields_the_task_kind_reads(adapted) -> None:
    tagger, questions = (adapted.client.get_run(r.run_id).data.params for r in adapted.standalone)
    assert [key for key in tagger if key.startswith("reader.")] == ["reader.tag_scheme"]
    assert not [key for key in questions if key.startswith("reader.")]  # label_text reads none
    assert "head.crf" in tagger and "head.pooling" not in tagger
    assert "head.pooling" in questions and "head.crf" not in questions
    assert "head.pair_head" not in tagger | questions
    assert "training.patience" not in tagger  # None: left out, not logged as "None"
    assert "None" not in [*tagger.values(), *questions.values()]
    assert tagger["bilm"] == str(adapted.model_dir) and tagger["device"] == "cpu"


def test_the_task_files_are_the_runs_datasets_with_their_digest(adapted) -> None:
    tagger = adapted.client.get_run(adapted.standalone[0].run_id)
    inputs = {
        item.dataset.name: (item.dataset.digest, json.loads(item.dataset.source), item.tags)
        for item in tagger.inputs.dataset_inputs
    }
    assert set(inputs) == {"tags.train", "tags.dev"}
    digest, source, tags = inputs["tags.dev"]
    path = adapted.root / "tags.dev"
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()[:36]
    assert source == {"uri": str(path)}
    assert [tag.value for tag in tags] == ["validation+testing"]  # one file, two splits


def test_the_chart_view_holds_epoch_curves_and_a_few_final_scores_each_named_once(
    adapted,
) -> None:
    for result, metric in zip(adapted.standalone, ["f1", "accuracy"], strict=True):
        assert result.metric == metric
        metrics = adapted.client.get_run(result.run_id).data.metrics
        metrics = {name: value for name, value in metrics.items() if not name.startswith("system/")}
        # task/...: the MLflow UI orders chart sections by name, the biLM's (bilm/...) first.
        # The curves are the first seed's, and named so.
        curves = {"elmo/train_loss", f"elmo/dev_{metric}", "elmo/gamma", "baseline/train_loss"}
        curves |= {f"baseline/dev_{metric}"} | {f"elmo/mix_weight_{j}" for j in range(3)}
        curves = {f"task/seed_0/{name}" for name in curves}
        means = {f"{p}/{s}_{metric}" for p in ("elmo", "baseline") for s in ("best_dev", "test")}
        means |= {f"gain/dev_{metric}", f"gain/test_{metric}"}
        finals = {f"task/summary/{name}" for name in means}
        assert set(metrics) == curves | finals  # each seed's score is a table's, not a chart's
        for name in curves:
            history = adapted.client.get_metric_history(result.run_id, name)
            assert [point.step for point in history] == [1, 2]
        # The top-level scores are the means over the seeds; each seed's are its own.
        assert result.seeds == [0, 1, 2] and result.elmo_scores[0] == result.elmo_test[metric]
        elmo, baseline = Scores(tuple(result.elmo_scores)), Scores(tuple(result.baseline_scores))
        assert metrics[f"task/summary/elmo/test_{metric}"] == pytest.approx(elmo.mean)
        gain_mean = metrics[f"task/summary/gain/test_{metric}"]
        assert gain_mean == pytest.approx(elmo.mean - baseline.mean)
        table = mlflow.artifacts.load_dict(f"runs:/{result.run_id}/{SEEDS_TABLE}")
        rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
        assert rows == [
            {"seed": seed, "elmo": pytest.approx(elmo_score), "baseline": pytest.approx(baseline)}
            for seed, elmo_score, baseline in zip(
                result.seeds, result.elmo_scores, result.baseline_scores, strict=True
            )
        ]
        gain = result.elmo_test[metric] - result.baseline_test[metric]
        assert result.gain[f"test_{metric}"] == pytest.approx(gain)  # the registered seed's


def test_every_score_the_mix_and_the_timings_are_in_scores_json(adapted) -> None:
    for result in adapted.standalone:
        scores = mlflow.artifacts.load_dict(f"runs:/{result.run_id}/scores.json")
        assert scores["metric"] == result.metric
        assert scores["registered_seed"] == result.seeds[0]  # every score below is its models'
        assert scores["elmo"]["test"] == result.elmo_test
        assert scores["baseline"]["dev"] == result.baseline_dev
        assert scores["elmo"]["best_epoch"] in (1, 2)
        mix = scores["mix"]["input"]
        assert mix["weights"] == pytest.approx(result.mix_weights)
        assert sum(mix["weights"]) == pytest.approx(1) and mix["gamma"] == result.gamma
        assert set(scores["seconds"]) == {"cache", "elmo", "baseline"}
        assert scores["seeds"] == {
            str(seed): {"elmo": elmo, "baseline": baseline}
            for seed, elmo, baseline in zip(
                result.seeds, result.elmo_scores, result.baseline_scores, strict=True
            )
        }
    tagger = mlflow.artifacts.load_dict(f"runs:/{adapted.standalone[0].run_id}/scores.json")
    assert {"precision", "recall", "f1.PER", "f1.LOC", "accuracy"} <= set(tagger["elmo"]["test"])


def test_each_run_logs_its_figures_and_tables(adapted) -> None:
    figures = {"scalar_mix.png", "dev_curve.png", "config.json", "scores.json"}
    figures |= {adapt_stage.RESULT_FILE}  # what a re-run of the same job reuses
    tables = {"sample_predictions.json", SEEDS_TABLE}
    expected = {
        "tagger": figures | tables | {"per_type_scores.json"},
        "questions": figures | tables | {"confusion_matrix.json", "confusion_matrix.png"},
    }
    for result in adapted.standalone:
        names = {item.path for item in adapted.client.list_artifacts(result.run_id)}
        assert names == expected[result.task]


def test_tagging_runs_score_each_entity_type_and_show_sample_predictions(adapted) -> None:
    run_id = adapted.standalone[0].run_id
    table = mlflow.load_table("per_type_scores.json", run_ids=[run_id])
    assert list(table["type"]) == ["LOC", "PER", "(all)"]
    assert list(table.columns[1:]) == ["precision", "recall", "f1", "gold", "predicted", "correct"]
    assert list(table["gold"]) == [3, 3, 6]  # the dev file (= test): 3 sentences, 2 entities each
    samples = mlflow.load_table("sample_predictions.json", run_ids=[run_id])
    assert list(samples.columns) == ["sentence", "gold", "predicted", "correct"]
    assert len(samples) == 3
    assert samples["sentence"][0].split()[1:3] == ["went", "to"]
    assert len(samples["gold"][0].split()) == len(samples["predicted"][0].split()) == 5
    assert list(samples["correct"]) == sorted(samples["correct"])  # the errors first


def test_classification_runs_show_the_confusion_matrix(adapted) -> None:
    run_id = adapted.standalone[1].run_id
    table = mlflow.load_table("confusion_matrix.json", run_ids=[run_id])
    assert list(table.columns) == ["gold", "predicted HUM", "predicted LOC"]
    assert list(table["gold"]) == ["HUM", "LOC"]
    assert table[["predicted HUM", "predicted LOC"]].to_numpy().sum(axis=1).tolist() == [1, 1]
    samples = mlflow.load_table("sample_predictions.json", run_ids=[run_id])
    assert set(samples["sentence"]) == {"where is Rome ?", "who is Bob ?"}
    assert set(samples["gold"]) == {"LOC", "HUM"}


def test_each_task_model_is_registered_with_a_few_tags_and_a_description(adapted) -> None:
    for result in adapted.standalone:
        assert (result.model_name, result.model_version) == (f"elmo-{result.task}", 1)
        version = adapted.client.get_model_version(result.model_name, "1")
        assert version.run_id == result.run_id
        metric = result.metric
        elmo, baseline = Scores(tuple(result.elmo_scores)), Scores(tuple(result.baseline_scores))
        assert version.tags == {
            "elmo.task": result.task,
            bilm_source.PATH_TAG: str(adapted.model_dir),
            f"elmo.test_{metric}": f"{elmo.mean:.4f}",
            f"elmo.test_{metric}_sd": f"{elmo.sd:.4f}",
            f"elmo.gain.test_{metric}": f"{elmo.mean - baseline.mean:+.4f}",
            "elmo.seeds": "0,1,2",
            "elmo.weights_seed": "0",
        }
        assert version.description.startswith(
            f"Adapted from `{adapted.model_dir}`: test {metric} {elmo} with ELMo, {baseline} "
            "without (mean ± sample standard deviation over seeds 0, 1, 2; "
        )
        assert f"This version holds seed 0's weights (test {metric} " in version.description
        model = adapted.client.get_registered_model(result.model_name)
        assert model.tags == {"elmo.kind": "task", "elmo.task": result.task}
    tagger = adapted.client.get_registered_model("elmo-tagger").description
    assert 'mlflow.pyfunc.load_model("models:/elmo-tagger/1")' in tagger
    assert 'pd.DataFrame({"sentence": ["Anna went to Rome ."]})' in tagger
    assert "`tags` (one per token)" in tagger and "labels `B-LOC`, `B-PER`, `O`" in tagger


def test_the_final_scores_are_metrics_of_the_logged_task_model(adapted) -> None:
    result = adapted.standalone[1]
    version = adapted.client.get_model_version(result.model_name, "1")
    logged = adapted.client.get_logged_model(version.source.removeprefix("models:/"))
    linked = {metric.key: metric.value for metric in logged.metrics}
    means = {f"{p}/{s}_accuracy" for p in MODELS for s in ("best_dev", "test")}
    means |= {"gain/dev_accuracy", "gain/test_accuracy"}
    finals = {f"task/summary/{name}" for name in means}
    # ... and its seed's curves at the epoch it was kept; no system sample
    kept = {f"task/seed_{result.seeds[0]}/elmo/{name}" for name in ("train_loss", "dev_accuracy")}
    assert finals | kept <= set(linked) and not [n for n in linked if n.startswith("system/")]
    (output,) = adapted.client.get_run(result.run_id).outputs.model_outputs
    assert output.model_id == logged.model_id and output.step >= 1  # an epoch
    assert logged.tags["mlflow.note.content"].startswith(
        f"The questions model with ELMo of seed 0, as it was at epoch {output.step} (kept: "
    )
    mean = Scores(tuple(result.elmo_scores)).mean
    assert linked["task/summary/elmo/test_accuracy"] == pytest.approx(mean)
    # Named as the model it is registered as, from its adapt run, not Ray's worker script
    assert logged.name == "elmo-questions" and logged.source_run_id == result.run_id
    assert logged.tags["mlflow.source.name"] == "pipelines.adapt"
    assert logged.tags.get("mlflow.source.git.commit") == stage_runs.git_commit()
    example = mlflow.models.Model.load(f"models:/{result.model_name}/1").load_input_example()
    assert example.to_dict("list") == {"sentence": ["where is Rome ?"]}


def test_inside_a_flow_the_run_is_a_child_tagged_with_the_registered_version(adapted) -> None:
    result = adapted.nested
    run = adapted.client.get_run(result.run_id)
    assert run.data.tags["mlflow.parentRunId"] == adapted.parent_id
    assert run.data.tags[bilm_source.MODEL_TAG] == "elmo-bilm"
    assert run.data.tags[bilm_source.VERSION_TAG] == "1"
    assert run.data.tags["elmo.flow"] == "test"
    assert result.model_uri == "models:/elmo-questions/2"
    model = adapted.client.get_registered_model("elmo-questions")
    assert 'load_model("models:/elmo-questions/2")' in model.description  # the newest version


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
    status = adapt_cli.main(["--task", str(bad), "--bilm", str(adapted.model_dir)])
    assert status == 2
    assert "hed" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="two tasks named questions"):
        adapt_stage.adapt([adapted.tasks[1]] * 2, str(adapted.model_dir))
    for seeds in ([], [1, 1]):
        with pytest.raises(ConfigError, match="seeds must be distinct and at least one"):
            adapt_stage.adapt(adapted.tasks, str(adapted.model_dir), seeds=seeds)


def test_the_same_job_again_reuses_its_run_and_model_wherever_its_files_lie(
    adapted, tmp_path
) -> None:
    """The nested job again: the same weights, read from the checkpoint rather than the
    registry, the same task with its files copied elsewhere, the same seed."""
    for name in ("questions.yaml", "questions.train", "questions.dev"):
        shutil.copy(adapted.root / name, tmp_path / name)
    versions = adapted.client.search_model_versions("name = 'elmo-questions'")

    (again,) = adapt_stage.adapt(
        [load_task_config(tmp_path / "questions.yaml")], str(adapted.model_dir), seeds=[5]
    )
    assert again.reused and not adapted.nested.reused
    assert (again.run_id, again.model_uri) == (adapted.nested.run_id, adapted.nested.model_uri)
    assert again.elmo_scores == adapted.nested.elmo_scores
    assert len(adapted.client.search_model_versions("name = 'elmo-questions'")) == len(versions)
    assert adapt_stage.result_line(again).startswith("task questions reused (already adapted): ")


def test_a_job_whose_registered_version_was_deleted_runs_again(adapted) -> None:
    (first,) = adapt_stage.adapt([adapted.tasks[0]], str(adapted.model_dir), seeds=[7])
    (reused,) = adapt_stage.adapt([adapted.tasks[0]], str(adapted.model_dir), seeds=[7])
    adapted.client.delete_model_version("elmo-tagger", str(first.model_version))
    (again,) = adapt_stage.adapt([adapted.tasks[0]], str(adapted.model_dir), seeds=[7])

    assert reused.reused and reused.run_id == first.run_id
    assert not again.reused and again.run_id != first.run_id
    assert again.model_version > first.model_version


def test_a_parsing_task_is_adapted_registered_and_parses_in_a_fresh_process(
    adapted, fresh_python
) -> None:
    """The fourth type end to end: CoNLL-U trees in, a registered parser whose answers are trees
    (one word on the root), with its error tables in the run."""
    words = [("Anna", 2, "nsubj"), ("went", 0, "root"), ("home", 2, "obj"), (".", 2, "punct")]
    sentence = "".join(
        f"{i}\t{w}\t_\t_\t_\t_\t{h}\t{r}\t_\t_\n" for i, (w, h, r) in enumerate(words, 1)
    )
    (adapted.root / "trees.conllu").write_text((sentence + "\n") * 12)
    (adapted.root / "parser.yaml").write_text(
        "name: parser\ntype: parsing\nformat: conllu\ntrain: trees.conllu\ndev: trees.conllu\n"
        f"test: trees.conllu\nhead: {{hidden_dim: 8}}\ntraining: {TRAINING}\n"
    )
    (result,) = adapt_stage.adapt(
        [load_task_config(adapted.root / "parser.yaml")], str(adapted.model_dir), seeds=[0]
    )
    artifacts = {a.path for a in adapted.client.list_artifacts(result.run_id)}
    assert {"attachment_by_distance.json", "relations_confused.json"} <= artifacts
    script = (
        "import json, mlflow, pandas as pd\n"
        "parser = mlflow.pyfunc.load_model('models:/elmo-parser/1')\n"
        "out = parser.predict(pd.DataFrame({'sentence': ['Bob went home .', '']}))\n"
        "print(json.dumps(out.to_dict('list'), default=list))\n"
    )
    printed = fresh_python(script, adapted.uri, adapted.root.parent)
    assert printed["tokens"] == [["Bob", "went", "home", "."], []]
    heads, relations = printed["heads"][0], printed["relations"][0]
    assert sorted(heads).count(0) == 1 and all(0 <= h <= 4 for h in heads)
    assert len(relations) == 4 and printed["heads"][1] == printed["relations"][1] == []
