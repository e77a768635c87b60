"""``python -m pipelines.evaluate``: the same command as ``elmo evaluate``."""

from pipelines.evaluate.stage import main

raise SystemExit(main())
