"""Interoperability with the original bilm-tf weight files."""
