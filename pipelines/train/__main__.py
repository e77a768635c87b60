"""``python -m pipelines.train``: the same command as ``elmo train``."""

from pipelines.train.cli import main

raise SystemExit(main())
