"""Baselines, one module each; importing this package registers them all."""

from baselines import fedavg, fedper, fedprox, local

__all__ = ["fedavg", "fedper", "fedprox", "local"]
