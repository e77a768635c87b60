"""The adapt stage: a frozen biLM + a learned scalar mix + a task head (``adapt.stage``)."""
