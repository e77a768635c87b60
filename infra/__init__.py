"""The deployment side: a package so that ``infra.device``'s scripts run with ``python -m``."""
