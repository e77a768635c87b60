"""``python -m pipelines.embed``: the same command as ``elmo embed``."""

from pipelines.embed.cli import main

raise SystemExit(main())
