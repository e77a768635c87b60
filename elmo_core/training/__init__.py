"""The biLM's training step and the gradient exchange it runs, shared by workers and benchmarks."""
