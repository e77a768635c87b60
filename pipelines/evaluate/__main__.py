"""``python -m pipelines.evaluate``: the same command as ``elmo evaluate``."""

from pipelines.common.console import quiet_environment

quiet_environment()  # before the stage imports MLflow and Ray: they read their switches then
from pipelines.evaluate.stage import main  # noqa: E402

raise SystemExit(main())
