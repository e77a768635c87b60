"""The train stage: distributed biLM pretraining on Ray Train.

``train.stage`` is the driver (``train()`` and ``main``); ``train.loop`` the per-worker loop, which
``train.worker`` runs on Ray Train and ``train.runtime.LocalRuntime`` in one process.
This file stays empty of imports: Ray workers import the stage's modules by path.
"""
