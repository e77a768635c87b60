"""``python -m pipelines.prepare``: the same command as ``elmo prepare``."""

from pipelines.prepare.stage import main

raise SystemExit(main())
