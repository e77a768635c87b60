"""What stages and flows share: settings, the CLI runner, MLflow tracking (a stage's run, a flow's
parent run), the Ray connection, the pre-flight server checks, the demo's sample embedding.

Imports no stage, so any stage can import it.
"""
