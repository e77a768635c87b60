"""The MLflow model registry: registering a biLM, the champion policy, imported weights."""
