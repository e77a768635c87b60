"""Parquet shards, manifests and streaming readers of prepared datasets."""
