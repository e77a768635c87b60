"""``python -m pipelines.embed``: the same command as ``elmo embed``."""

from pipelines.common.console import quiet_environment

quiet_environment()  # before the stage imports MLflow and Ray: they read their switches then
from pipelines.embed.stage import main  # noqa: E402

raise SystemExit(main())
