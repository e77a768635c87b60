"""``python -m pipelines.registry register|promote|import-weights``: the ``elmo`` commands."""

from pipelines.common.console import quiet_environment

quiet_environment()  # before the stages import MLflow and Ray: they read their switches then
from pipelines.cli import StageCommands  # noqa: E402
from pipelines.common.cli_runner import run_app  # noqa: E402

commands = StageCommands(
    name="python -m pipelines.registry",
    no_args_is_help=True,
    commands=("register", "promote", "import-weights"),
)
raise SystemExit(run_app(commands))
