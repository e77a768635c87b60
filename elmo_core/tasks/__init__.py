"""Downstream tasks: readers, heads and metrics for scalar-mix adaptation."""
