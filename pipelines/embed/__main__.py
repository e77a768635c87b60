"""``python -m pipelines.embed``: the same command as ``elmo embed``."""

from pipelines.embed.stage import main

raise SystemExit(main())
