"""The PostgreSQL stack without its servers: the settings it shares with the compose file, and the
order and refusals of its services."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml

from infra.local import postgres

COMPOSE = Path(__file__).resolve().parents[4] / "infra" / "compose"


def test_the_stack_and_the_compose_file_share_user_databases_and_drivers() -> None:
    services = yaml.safe_load((COMPOSE / "docker-compose.yaml").read_text())["services"]
    environment = services["postgres"]["environment"]
    assert environment["POSTGRES_DB"] == postgres.DATABASES[0]
    created = (COMPOSE / "postgres-init.sql").read_text()
    assert f"CREATE DATABASE {postgres.DATABASES[1]};" in created
    assert f"POSTGRES_USER={postgres.USER}\n" in (COMPOSE / ".env.example").read_text()
    prefect = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert prefect.startswith(f"{postgres.PREFECT_DRIVER}://")
    assert prefect.endswith(f"/{postgres.DATABASES[0]}")
    store = next(a for a in services["mlflow"]["command"] if a.startswith("--backend-store-uri="))
    assert store.startswith(f"--backend-store-uri={postgres.MLFLOW_DRIVER}://")
    assert store.endswith(f"/{postgres.DATABASES[1]}")


def test_the_servers_wait_for_postgres_only_on_the_postgres_stack(
    stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    on_sqlite = stack_module.StackConfig.from_env()
    assert "postgres" not in on_sqlite.services
    assert stack_module.SERVICES["mlflow"].prerequisites(on_sqlite) == ()
    monkeypatch.setenv("ELMO_STACK_DATABASE", "postgresql")
    team = stack_module.StackConfig.from_env()
    assert team.services[0] == "postgres"
    assert stack_module.SERVICES["mlflow"].prerequisites(team) == ("postgres",)
    assert stack_module.SERVICES["worker"].prerequisites(team) == ("prefect",)
    url = team.database_url("mlflow", postgres.MLFLOW_DRIVER)
    secret = (tmp_path / "stack" / "postgres_password").read_text()
    assert url == f"{postgres.MLFLOW_DRIVER}://{postgres.USER}:{secret}@127.0.0.1:5432/mlflow"
    assert (tmp_path / "stack" / "postgres_password").stat().st_mode & 0o777 == 0o600


def test_an_unknown_database_is_refused_naming_the_setting(
    stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    monkeypatch.setenv("ELMO_STACK_DATABASE", "mysql")
    with pytest.raises(stack_module.StackError, match="ELMO_STACK_DATABASE='mysql'"):
        stack_module.StackConfig.from_env()


def test_a_missing_postgresql_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(postgres.glob, "glob", lambda pattern: [])
    with pytest.raises(postgres.PostgresError, match="apt-get install postgresql"):
        postgres.binary("initdb")
