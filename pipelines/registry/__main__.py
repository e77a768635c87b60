"""``python -m pipelines.registry register|promote|import-weights``: the ``elmo`` commands."""

from pipelines.cli import StageCommands
from pipelines.common.cli_runner import run_app

commands = StageCommands(
    name="python -m pipelines.registry",
    no_args_is_help=True,
    commands=("register", "promote", "import-weights"),
)
raise SystemExit(run_app(commands))
