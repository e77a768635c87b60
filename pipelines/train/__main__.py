"""``python -m pipelines.train``: the same command as ``elmo train`` (train, then evaluate and
register: :mod:`pipelines.cli` chains them)."""

from pipelines.cli import train_main

raise SystemExit(train_main())
