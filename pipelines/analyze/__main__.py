"""``python -m pipelines.analyze``: the same command as ``elmo analyze``."""

from pipelines.common.console import quiet_environment

quiet_environment()  # before the stage imports MLflow and Ray: they read their switches then
from pipelines.analyze.stage import main  # noqa: E402

raise SystemExit(main())
