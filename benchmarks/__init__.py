"""Speed and memory benchmarks on ``harness.py``, each run as ``python -m benchmarks.<script>``."""
