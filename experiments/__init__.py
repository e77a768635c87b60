"""One-off studies, each beside its dated result, run as ``python -m experiments.<script>``."""
