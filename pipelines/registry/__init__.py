"""The MLflow model registry: registering a biLM, the champion policy, imported weights.

``python -m pipelines.registry register|promote|import-weights`` runs the same commands as
``elmo register|promote|import-weights``.
"""
