"""Seeding, and the random streams of several runs stepped together in one process.

A run draws from the process-wide generators (Python, NumPy, torch on the CPU and on CUDA): model
initialisation, dropout masks, a method's own sampling. Runs stacked along a seed axis
(`runner.run_together`) take turns on those generators, so each keeps its own streams in a
`RunRandomness` and swaps them in for every step it takes: each run then draws exactly the numbers
it would draw alone, and a stacked run reproduces its unstacked record.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int, device: torch.device) -> None:
    """Same seed, same device, same numbers: seed every RNG and ask for deterministic kernels."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new uninitialised tensor with NaN (a guard against kernels that
    # read memory they never wrote). No kernel here does (every result would be NaN), and the fill cost
    # a fifth of a batched Cora round: each large `empty` was written twice (docs/results.md, "Speed").
    torch.utils.deterministic.fill_uninitialized_memory = False


class RunRandomness:
    """One run's state of the process-wide generators, captured when created (after the run's set-up)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._state = self._capture()

    def _capture(self) -> tuple[Any, ...]:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda

    def _restore(self) -> None:
        python, numpy, cpu, cuda = self._state
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.device)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Draw from this run's streams inside the block; where they stopped is kept for the next block."""
        self._restore()
        try:
            yield
        finally:
            self._state = self._capture()


class SharedRandomness(RunRandomness):
    """A run alone in its process: it owns the generators, so there is nothing to swap."""

    def __init__(self) -> None:  # noqa: D107 - nothing to capture
        pass

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        yield
