"""``python -m pipelines.train``: the same command as ``elmo train``."""

from pipelines.common.console import quiet_environment

quiet_environment()  # before the stage imports MLflow and Ray: they read their switches then
from pipelines.train.stage import main  # noqa: E402

raise SystemExit(main())
