"""The ``pretrain`` flow: corpus → dataset → biLM → perplexity → registered model → task models.

Re-running reuses what is done: the cached dataset, a finished training run (a stopped one
resumes), the model version registered from that run, finished adapt and analyze runs of the same
biLM, tasks and settings.
"""

from __future__ import annotations

from prefect import flow

from flows.artifacts import PretrainSummary
from flows.params import PretrainParams
from flows.runs import flow_parent_run
from flows.tasks import (
    BUNDLED_SENSES,
    adapt,
    analyze,
    check_analysis,
    check_task_files,
    evaluate,
    prepare,
    register,
    summarize,
    train,
)
from pipelines.adapt.stage import result_line
from pipelines.common.services import check_services


@flow(name="pretrain")
def pretrain(params: PretrainParams) -> PretrainSummary:
    """Pretrain a biLM on a corpus, register it, adapt it to the configured tasks and, with
    ``params.analyze``, analyze it on them."""
    check_services(ray_jobs=params.training.resolved_mode() == "ray-job")
    check_task_files(params.tasks)
    if params.analyze:
        check_analysis(params.tasks, params.fractions, params.seeds)
    subject = f"{params.data.corpus_name()}-{params.training.model}"
    with flow_parent_run("pretrain", subject, params) as parent:
        dataset = prepare(params.data, parent)
        run = train(dataset, params.training, parent)
        hand_on = params.training.hand_on
        perplexity = evaluate(run, dataset, parent, hand_on)
        model = register(run, dataset, perplexity, params.model_name, parent, hand_on)
        results = adapt(model.uri, params.tasks, parent, seeds=params.seeds)
        analysis = None
        if params.analyze and params.tasks:
            analysis = analyze(
                model.uri,
                params.tasks,
                parent,
                senses=BUNDLED_SENSES,
                fractions=params.fractions,
                seeds=params.seeds,
            )
        summarize(dataset, run, hand_on, perplexity, model, results, parent, analysis)
    return PretrainSummary(
        dataset=dataset,
        train_run=run.run_name,
        model_dir=run.handed_on(params.training.hand_on).model_dir,
        already_trained=run.already_finished,
        perplexity=perplexity.perplexity,
        model_uri=model.uri,
        champion=model.champion,
        task_models=[result.model_uri for result in results],
        task_scores=[result_line(result) for result in results],
        parent_run_id=parent,
        analysis_run_id=analysis.run_id if analysis is not None else None,
        analysis_headline=analysis.headline if analysis is not None else [],
    )
