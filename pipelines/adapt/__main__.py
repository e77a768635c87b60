"""``python -m pipelines.adapt``: the same command as ``elmo adapt``."""

from pipelines.adapt.cli import main

raise SystemExit(main())
