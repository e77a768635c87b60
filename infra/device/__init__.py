"""The GPU suite and its CPU rehearsal, run from the root: ``python -m infra.device.<script>``."""
