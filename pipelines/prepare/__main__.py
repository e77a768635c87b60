"""``python -m pipelines.prepare``: the same command as ``elmo prepare``."""

from pipelines.prepare.cli import main

raise SystemExit(main())
