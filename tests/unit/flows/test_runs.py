"""Where the flow links a flow run in Prefect's UI."""

from __future__ import annotations

from uuid import UUID

from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

from flows.runs import flow_run_url

FLOW_RUN = UUID("12345678-1234-5678-1234-567812345678")


def test_an_ephemeral_flow_run_links_to_the_ui_prefect_server_start_serves() -> None:
    with temporary_settings(restore_defaults={PREFECT_API_URL, PREFECT_UI_URL}):
        assert flow_run_url(FLOW_RUN) == f"http://127.0.0.1:4200/runs/flow-run/{FLOW_RUN}"


def test_a_flow_run_on_a_server_links_to_that_servers_ui() -> None:
    with temporary_settings(
        updates={PREFECT_API_URL: "http://prefect.example:4200/api"},
        restore_defaults={PREFECT_UI_URL},
    ):
        assert flow_run_url(FLOW_RUN) == f"http://prefect.example:4200/runs/flow-run/{FLOW_RUN}"
