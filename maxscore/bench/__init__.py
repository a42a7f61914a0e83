"""Benchmarks: the scoring harness (items/s against the measured matmul peak) and the transformers baseline."""
