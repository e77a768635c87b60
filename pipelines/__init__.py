"""Stages as plain functions with ``python -m pipelines.<stage>`` entry points (Ray, MLflow)."""
