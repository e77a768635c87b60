"""What the flow's log says while a biLM trains, and where it links a flow run in Prefect's UI."""

from __future__ import annotations

from uuid import UUID

from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

from flows.tasks import flow_run_url, progress_due

FLOW_RUN = UUID("12345678-1234-5678-1234-567812345678")


def test_the_first_step_seen_is_logged_then_each_tenth_of_the_run() -> None:
    assert progress_due(100, 1500, None, seconds=0.0, interval=60.0)
    assert not progress_due(100, 1500, 100, seconds=5.0, interval=60.0)  # no new step
    assert not progress_due(140, 1500, 100, seconds=5.0, interval=60.0)  # still the first tenth
    assert progress_due(150, 1500, 140, seconds=5.0, interval=60.0)
    assert progress_due(300, 1500, 200, seconds=5.0, interval=60.0)
    assert progress_due(20, 20, 18, seconds=0.1, interval=60.0)


def test_a_long_run_is_logged_at_least_every_interval() -> None:
    total = 1_000_000  # a tenth is hours away
    assert not progress_due(1_100, total, 1_000, seconds=59.0, interval=60.0)
    assert progress_due(1_100, total, 1_000, seconds=60.0, interval=60.0)
    assert progress_due(1_100, None, 1_000, seconds=60.0, interval=60.0)  # total not yet known
    assert not progress_due(1_100, None, 1_000, seconds=1.0, interval=60.0)


def test_an_ephemeral_flow_run_links_to_the_ui_prefect_server_start_serves() -> None:
    with temporary_settings(restore_defaults={PREFECT_API_URL, PREFECT_UI_URL}):
        assert flow_run_url(FLOW_RUN) == f"http://127.0.0.1:4200/runs/flow-run/{FLOW_RUN}"


def test_a_flow_run_on_a_server_links_to_that_servers_ui() -> None:
    with temporary_settings(
        updates={PREFECT_API_URL: "http://prefect.example:4200/api"},
        restore_defaults={PREFECT_UI_URL},
    ):
        assert flow_run_url(FLOW_RUN) == f"http://prefect.example:4200/runs/flow-run/{FLOW_RUN}"
