"""The train stage: distributed biLM pretraining on Ray Train.

``train.stage`` is the driver (``train(cfg, data, where=...)`` and ``main``); ``train.worker`` one
rank's loop, run by Ray Train or in one process; ``train.checkpoint`` what a checkpoint holds and
where a run keeps them. This file stays empty of imports: Ray workers import the stage's modules
by path.
"""
