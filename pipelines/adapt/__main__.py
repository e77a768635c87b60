"""``python -m pipelines.adapt``: the same command as ``elmo adapt``."""

from pipelines.common.console import quiet_environment

quiet_environment()  # before the stage imports MLflow and Ray: they read their switches then
from pipelines.adapt.stage import main  # noqa: E402

raise SystemExit(main())
