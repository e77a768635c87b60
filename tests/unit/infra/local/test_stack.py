"""infra/local/stack.py without its servers: configuration, session-wide stop, refusals, and the
PostgreSQL settings it shares with the compose file."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import yaml


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def cfg(stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    for variable in ("ELMO_PREFECT_PORT", "ELMO_MLFLOW_PORT", "ELMO_RAY_DASHBOARD_PORT"):
        monkeypatch.setenv(variable, str(_free_port()))
    config = stack_module.StackConfig.from_env()
    for sub in ("logs", "pids"):
        (config.state_dir / sub).mkdir(parents=True)
    return config


def _groups(pids: list[int]) -> set[int]:
    return {os.getpgid(pid) for pid in pids}


@pytest.fixture
def service_session(stack_module: ModuleType, cfg: object) -> Iterator[subprocess.Popen[bytes]]:
    """A fake 'mlflow' session: a shell, a plain child and a child in its own process group."""
    own_group = "import os, time; os.setpgid(0, 0); time.sleep(60)"
    process = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} -c '{own_group}' & sleep 60 & wait"],
        start_new_session=True,
    )
    (cfg.state_dir / "pids" / "mlflow.pid").write_text(str(process.pid))
    deadline = time.monotonic() + 10
    while (
        len(_groups(stack_module.session_processes(process.pid))) < 2
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    yield process
    for pid in stack_module.session_processes(process.pid):
        os.kill(pid, 9)
    process.wait()


def test_config_reads_ports_and_home_from_the_environment(
    stack_module: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    monkeypatch.setenv("ELMO_PREFECT_PORT", "14200")
    monkeypatch.setenv("ELMO_RAY_PORT", "16379")
    monkeypatch.setenv("ELMO_RAY_DASHBOARD_PORT", "18265")
    cfg = stack_module.StackConfig.from_env()

    assert cfg.client_env() == {
        "PREFECT_API_URL": "http://127.0.0.1:14200/api",
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "RAY_ADDRESS": "127.0.0.1:16379",
        "RAY_API_SERVER_ADDRESS": "http://127.0.0.1:18265",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(tmp_path / "stack" / "ray_auth_token"),
        **stack_module.CLIENT_RETRIES,
    }
    assert f"sqlite:///{tmp_path}/mlflow.db" in stack_module._mlflow_command(cfg)


def test_ray_temp_dir_stays_short_enough_for_unix_sockets(stack_module: ModuleType) -> None:
    assert stack_module.ray_temp_dir(Path("/h")) == Path("/h/stack/ray")
    deep_a = stack_module.ray_temp_dir(Path("/tmp/pytest-of-someone/pytest-123/test_a0/elmo"))
    deep_b = stack_module.ray_temp_dir(Path("/tmp/pytest-of-someone/pytest-123/test_b0/elmo"))
    assert deep_a != deep_b
    assert len(str(deep_a)) <= stack_module.MAX_RAY_TEMP_DIR_CHARS


def test_ray_token_is_private_and_kept_across_starts(stack_module: ModuleType, cfg: object) -> None:
    stack_module._ensure_ray_token(cfg)
    token = cfg.ray_token_path.read_text()
    stack_module._ensure_ray_token(cfg)

    assert cfg.ray_token_path.read_text() == token
    assert len(token) == 64
    assert stat.S_IMODE(cfg.ray_token_path.stat().st_mode) == 0o600


def test_stop_ends_every_process_of_the_session_even_in_other_groups(
    stack_module: ModuleType, cfg: object, service_session: subprocess.Popen[bytes]
) -> None:
    pids = stack_module.session_processes(service_session.pid)
    assert len(pids) == 3 and len(_groups(pids)) == 2

    stack_module.stop_services(cfg, ["mlflow"])

    assert stack_module.session_processes(service_session.pid) == []
    assert stack_module.recorded_session(cfg, "mlflow") is None


def test_stop_kills_what_ignores_sigterm_after_the_grace_period(
    stack_module: ModuleType, cfg: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_module, "STOP_GRACE_S", 0.5)
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", stubborn], stdout=subprocess.PIPE, start_new_session=True
    )
    (cfg.state_dir / "pids" / "prefect.pid").write_text(str(process.pid))
    assert process.stdout is not None
    assert process.stdout.readline() == b"ignoring\n"  # its handler is in place, however slow

    stack_module.stop_services(cfg, ["prefect"])

    assert process.wait(timeout=5) == -9


def test_start_refuses_a_port_held_by_another_program(
    stack_module: ModuleType, cfg: object
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", cfg.mlflow_port))
        other.listen()
        with pytest.raises(stack_module.StackError, match="port .* in use .* set ELMO_MLFLOW_PORT"):
            stack_module.start(cfg, ["mlflow"])


@pytest.mark.parametrize("failures", [1, 2])
def test_a_ray_that_timed_out_starting_is_launched_once_more(
    stack_module: ModuleType,
    cfg: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failures: int,
) -> None:
    """As `ray start` does when its raylet misses its 30 s to register on a loaded core: the
    launcher exits 1 saying so, and the next launch may succeed. A second failure is the
    stack's."""
    tries, up = cfg.state_dir / "tries", cfg.state_dir / "up"
    timed_out = f"echo '{stack_module.RAY_STARTUP_TIMEOUT}. This could happen'; exit 1"
    launcher = f"echo x >> {tries}; [ $(wc -l < {tries}) -gt {failures} ] || {{ {timed_out}; }}"
    fake = replace(
        stack_module.SERVICES["ray"], command=lambda c: ["sh", "-c", f"{launcher}; touch {up}"]
    )
    fake = replace(fake, healthy=lambda c: up.exists())
    monkeypatch.setitem(stack_module.SERVICES, "ray", fake)

    if failures == 1:
        assert set(stack_module.start(cfg, ["ray"])) == {"ray"}
    else:
        with pytest.raises(stack_module.StackError, match="ray exited with code 1"):
            stack_module.start(cfg, ["ray"])
    assert len(tries.read_text().split()) == 2
    assert "ray: ray exited with code 1; launching it once more" in capsys.readouterr().err


def test_any_other_failure_to_start_is_reported_at_once(
    stack_module: ModuleType, cfg: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong setting fails every launch alike: no second one."""
    tries = cfg.state_dir / "tries"
    launcher = f"echo x >> {tries}; echo 'Resource quantities must be nonnegative'; exit 1"
    fake = replace(stack_module.SERVICES["ray"], command=lambda c: ["sh", "-c", launcher])
    monkeypatch.setitem(stack_module.SERVICES, "ray", fake)

    with pytest.raises(stack_module.StackError, match="must be nonnegative"):
        stack_module.start(cfg, ["ray"])
    assert len(tries.read_text().split()) == 1


def test_worker_alone_needs_a_running_prefect_server(stack_module: ModuleType, cfg: object) -> None:
    with pytest.raises(stack_module.StackError, match="worker needs prefect"):
        stack_module.start(cfg, ["worker"])


def test_status_of_a_stopped_stack_fails_and_names_each_service(
    stack_module: ModuleType, cfg: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack_module.main(["status", "--services", "ray,mlflow"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[:2] for line in lines] == [["mlflow", "stopped"], ["ray", "stopped"]]


def test_unknown_service_is_a_usage_error(stack_module: ModuleType) -> None:
    with pytest.raises(SystemExit) as exit_info:
        stack_module.main(["start", "--services", "mlflow,airflow"])
    assert exit_info.value.code == 2


COMPOSE = Path(__file__).resolve().parents[4] / "infra" / "compose"


def test_the_stack_and_the_compose_file_share_user_databases_and_drivers(
    stack_module: ModuleType,
) -> None:
    services = yaml.safe_load((COMPOSE / "docker-compose.yaml").read_text())["services"]
    environment = services["postgres"]["environment"]
    assert environment["POSTGRES_DB"] == stack_module.POSTGRES_DATABASES[0]
    created = (COMPOSE / "postgres-init.sql").read_text()
    assert f"CREATE DATABASE {stack_module.POSTGRES_DATABASES[1]};" in created
    assert f"POSTGRES_USER={stack_module.POSTGRES_USER}\n" in (COMPOSE / ".env.example").read_text()
    prefect = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert prefect.startswith(f"{stack_module.PREFECT_DRIVER}://")
    assert prefect.endswith(f"/{stack_module.POSTGRES_DATABASES[0]}")
    store = next(a for a in services["mlflow"]["command"] if a.startswith("--backend-store-uri="))
    assert store.startswith(f"--backend-store-uri={stack_module.MLFLOW_DRIVER}://")
    assert store.endswith(f"/{stack_module.POSTGRES_DATABASES[1]}")
    assert services["mlflow"]["environment"][stack_module.MLFLOW_JOBS] == "false"


def test_the_servers_wait_for_postgres_only_on_the_postgres_stack(
    stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    on_sqlite = stack_module.StackConfig.from_env()
    assert "postgres" not in on_sqlite.services
    assert stack_module.SERVICES["mlflow"].prerequisites(on_sqlite) == ()
    monkeypatch.setenv("ELMO_STACK_DATABASE", "postgresql")
    team = stack_module.StackConfig.from_env()
    assert team.services == list(stack_module.SERVICE_ORDER)  # with the second Ray node
    assert "ray-node" not in on_sqlite.services
    assert stack_module.SERVICES["mlflow"].prerequisites(team) == ("postgres",)
    assert stack_module.SERVICES["worker"].prerequisites(team) == ("prefect",)
    url = team.database_url("mlflow", stack_module.MLFLOW_DRIVER)
    secret = (tmp_path / "stack" / "postgres_password").read_text()
    assert (
        url
        == f"{stack_module.MLFLOW_DRIVER}://{stack_module.POSTGRES_USER}:{secret}@127.0.0.1:5432/mlflow"
    )
    assert (tmp_path / "stack" / "postgres_password").stat().st_mode & 0o777 == 0o600


def test_an_unknown_database_is_refused_naming_the_setting(
    stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    monkeypatch.setenv("ELMO_STACK_DATABASE", "mysql")
    with pytest.raises(stack_module.StackError, match="ELMO_STACK_DATABASE='mysql'"):
        stack_module.StackConfig.from_env()


def test_a_missing_postgresql_says_how_to_install_it(
    stack_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(stack_module.glob, "glob", lambda pattern: [])
    with pytest.raises(stack_module.StackError, match="apt-get install postgresql"):
        stack_module.postgres_binary("initdb")


def test_the_second_ray_node_joins_the_head_on_its_own_agent_port(
    stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    monkeypatch.setenv("ELMO_RAY_WORKER_NODE", "1")
    monkeypatch.setenv("ELMO_RAY_PORT", "16379")
    monkeypatch.setenv("ELMO_RAY_NODE_AGENT_PORT", "52999")
    monkeypatch.setenv("ELMO_RAY_NUM_CPUS", "1")
    cfg = stack_module.StackConfig.from_env()

    assert cfg.services[-2:] == ["ray-node", "worker"]
    assert stack_module.SERVICES["ray-node"].prerequisites(cfg) == ("ray",)
    command = stack_module._ray_node_command(cfg)
    joined = " ".join(command)
    assert "--head" not in command
    assert "--address 127.0.0.1:16379" in joined
    assert "--dashboard-agent-listen-port 52999" in joined
    assert "--num-cpus 1" in joined
    assert stack_module.RAY_NODE_RESOURCE in joined
    monkeypatch.setenv("ELMO_RAY_WORKER_NODE", "yes")
    with pytest.raises(stack_module.StackError, match="ELMO_RAY_WORKER_NODE='yes'"):
        stack_module.StackConfig.from_env()


def test_a_database_port_held_by_another_server_is_refused_naming_the_setting(
    stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    monkeypatch.setenv("ELMO_STACK_DATABASE", "postgresql")
    with socket.socket() as other:  # say, another project's database
        other.bind(("127.0.0.1", 0))
        other.listen()
        monkeypatch.setenv("ELMO_POSTGRES_PORT", str(other.getsockname()[1]))
        cfg = stack_module.StackConfig.from_env()
        began = time.monotonic()
        with pytest.raises(
            stack_module.StackError, match="postgres: port .* set ELMO_POSTGRES_PORT"
        ):
            stack_module.start(cfg, ["postgres", "mlflow"])
    assert time.monotonic() - began < 5
    assert not list((tmp_path / "stack" / "pids").iterdir())  # nothing started half-way
