"""``python -m pipelines.train``: the same command as ``elmo train``."""

from pipelines.train.stage import main

raise SystemExit(main())
