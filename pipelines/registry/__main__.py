"""``python -m pipelines.registry register|promote|import-weights``: the ``elmo`` commands."""

from pipelines.registry.cli import main

raise SystemExit(main())
