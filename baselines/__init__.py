"""Baselines, one module each; each registers through the `gflbench.methods` entry points in pyproject.toml."""
