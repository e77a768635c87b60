"""MLflow run handling: a stage's run and a flow run's parent run."""
