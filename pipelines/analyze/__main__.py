"""``python -m pipelines.analyze``: the same command as ``elmo analyze``."""

from pipelines.analyze.cli import main

raise SystemExit(main())
