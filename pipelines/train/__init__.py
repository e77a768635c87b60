"""The train stage: distributed biLM pretraining on Ray Train.

``train.stage`` is the driver (``train()`` and ``main``); ``train.worker`` the per-worker loop.
This file stays empty of imports: Ray workers import the stage's modules by path.
"""
