"""``python -m pipelines.adapt``: the same command as ``elmo adapt``."""

from pipelines.adapt.stage import main

raise SystemExit(main())
