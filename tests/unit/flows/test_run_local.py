"""``make run``'s pointer to its Prefect history: the UI that shows the flow run it just ran."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from prefect.settings import PREFECT_API_URL, PREFECT_HOME, PREFECT_UI_URL, temporary_settings

from flows.run_local import embedded_settings, prefect_ui_hint

FLOW_RUN = UUID("12345678-1234-5678-1234-567812345678")


def test_the_embedded_run_names_the_command_that_serves_its_history_then_the_flow_run(
    tmp_path: Path,
) -> None:
    home = embedded_settings(tmp_path / "elmo", {})["PREFECT_HOME"]
    with temporary_settings(
        updates={PREFECT_HOME: home}, restore_defaults={PREFECT_API_URL, PREFECT_UI_URL}
    ):
        hint = prefect_ui_hint(FLOW_RUN)

    assert hint.splitlines() == [
        f"Prefect UI: PREFECT_HOME={tmp_path}/elmo/prefect prefect server start",
        f"  then open http://127.0.0.1:4200/runs/flow-run/{FLOW_RUN}",
    ]


def test_a_ui_on_another_port_is_served_there_and_finds_its_api_there(tmp_path: Path) -> None:
    """``PREFECT_UI_URL`` moves the link; the printed command serves the UI at that address, and
    tells the UI where its API is (else the page asks 4200 for its data)."""
    home = embedded_settings(tmp_path / "elmo", {})["PREFECT_HOME"]
    with temporary_settings(
        updates={PREFECT_HOME: home, PREFECT_UI_URL: "http://127.0.0.1:4255"},
        restore_defaults={PREFECT_API_URL},
    ):
        hint = prefect_ui_hint(FLOW_RUN)

    assert hint.splitlines() == [
        f"Prefect UI: PREFECT_HOME={tmp_path}/elmo/prefect "
        "PREFECT_UI_API_URL=http://127.0.0.1:4255/api prefect server start "
        "--host 127.0.0.1 --port 4255",
        f"  then open http://127.0.0.1:4255/runs/flow-run/{FLOW_RUN}",
    ]


def test_a_run_on_a_prefect_server_links_to_it() -> None:
    with temporary_settings(
        updates={PREFECT_API_URL: "http://prefect.example:4200/api"},
        restore_defaults={PREFECT_UI_URL},
    ):
        hint = prefect_ui_hint(FLOW_RUN)

    assert hint == f"Prefect UI: http://prefect.example:4200/runs/flow-run/{FLOW_RUN}"
