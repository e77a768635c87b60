"""The ``analyze`` flow: the paper's section 5 for an existing biLM, in the flow's own process."""

from __future__ import annotations

from prefect import flow

from flows import tasks
from flows.artifacts import AnalyzeSummary
from flows.params import AnalyzeParams
from flows.runs import flow_parent_run
from pipelines.analyze.table import format_rows
from pipelines.common.services import check_services


@flow(name="analyze")
def analyze(params: AnalyzeParams) -> AnalyzeSummary:
    """Analyze ``params.bilm`` on every task (and the sense set); returns the runs and table."""
    check_services(ray_jobs=False)
    tasks.check_task_files(params.tasks)
    with flow_parent_run("analyze", params.bilm, params) as parent:
        result = tasks.analyze(
            params.bilm,
            params.tasks,
            parent,
            bilm_options=params.bilm_options,
            senses=params.senses(),
            fractions=params.fractions,
            seeds=params.seeds,
        )
    table = format_rows(result.rows).splitlines()
    return AnalyzeSummary(run_id=result.run_id, parent_run_id=parent, table=table)
