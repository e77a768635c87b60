"""The prepare stage: a corpus → Parquet shards, vocabulary, word types and a manifest.

``prepare.stage`` holds ``prepare()`` and ``main``. This file stays empty of imports: the
pool's worker processes and Ray tasks import the stage's modules by path.
"""
