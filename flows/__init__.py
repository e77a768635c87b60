"""Thin Prefect flows over the pipeline stages."""
