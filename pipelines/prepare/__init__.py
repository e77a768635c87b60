"""The prepare stage: a corpus → Parquet shards, vocabulary, word types and a manifest.

This file stays empty of imports: pool processes and Ray tasks import the stage's modules by path.
"""
