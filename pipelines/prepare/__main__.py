"""``python -m pipelines.prepare``: the same command as ``elmo prepare``."""

from pipelines.common.console import quiet_environment

quiet_environment()  # before the stage imports MLflow and Ray: they read their switches then
from pipelines.prepare.stage import main  # noqa: E402

raise SystemExit(main())
