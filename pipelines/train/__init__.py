"""The train stage: distributed biLM pretraining on Ray Train.

This file stays empty of imports: Ray workers import the stage's modules by path.
"""
