"""``python -m pipelines.analyze``: the same command as ``elmo analyze``."""

from pipelines.analyze.stage import main

raise SystemExit(main())
