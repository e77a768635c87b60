"""What every stage shares: settings, the CLI runner, MLflow tracking, the Ray connection.

Imports no stage, so any stage can import it.
"""
