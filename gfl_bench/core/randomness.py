"""Seeding, and the random streams of several runs stepped together in one process.

A run draws from the process-wide generators (Python, NumPy, torch on the CPU and on CUDA): model
initialisation, dropout masks, a method's own sampling. Runs stacked along a seed axis
(`runner.run_together`) take turns on those generators, so each keeps its own streams in a
`RunRandomness` and swaps them in for every step it takes: each run then draws exactly the numbers
it would draw alone, and a stacked run reproduces its unstacked record. Which clients take part in a
round (`Participation`) is drawn from a stream of its own, apart from all of these.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import warnings
from collections.abc import Iterator
from fractions import Fraction
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
    torch.use_deterministic_algorithms(
        True, warn_only=True
    )  # what has no deterministic kernel: `nondeterministic_kernels`
    # Deterministic mode also fills every new uninitialised tensor with NaN (a guard against kernels that
    # read memory they never wrote). No kernel here does (every result would be NaN), and the fill cost
    # a fifth of a batched Cora round: each large `empty` was written twice (docs/results.md, "Speed").
    torch.utils.deterministic.fill_uninitialized_memory = False


# torch's alert for a kernel without a deterministic implementation (deterministic mode, warn_only=True)
_ALERT = re.compile(r"(\S+) does not have a deterministic implementation")


@contextlib.contextmanager
def nondeterministic_kernels() -> Iterator[set[str]]:
    """The names of the kernels without a deterministic implementation that ran inside the block.

    Deterministic mode is set with `warn_only=True`: a kernel torch has only in a non-deterministic form
    (on CUDA, e.g. `bincount` with weights, `histc`, `put_`, some `scatter_reduce` modes) still runs, and
    torch warns. Workers silence library warnings, so instead of a warning nobody sees, the run's record
    names each such kernel (`nondeterministic_kernels`; empty: every kernel the run used was deterministic).
    Other warnings are shown as they would have been.
    """
    found: set[str] = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", message=_ALERT.pattern)  # also where all warnings are ignored
        yield found
    for warning in caught:
        match = _ALERT.match(str(warning.message))
        if match:
            found.add(match.group(1))
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno, warning.file,
                                 warning.line)  # fmt: skip


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Draw from generators seeded with `seed` inside the block, and leave the run's streams as they were:
    the CPU generator and, on CUDA, the run's device generator (`torch.manual_seed` seeds every device)."""
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        torch.manual_seed(seed)
        yield


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

    def __init__(self) -> None:
        pass

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        yield


# Mixed into the run seed for the participation stream, so that it is not the stream any generator seeded
# with the run seed alone would give (b"part").
_PARTICIPATION_STREAM = 0x70617274


def sampled_count(participation: float, clients: int) -> int:
    """⌈F·M⌉, computed on the decimal F was written as: 0.3 of 10 clients is 3, not ⌈3.0000000000000004⌉ = 4."""
    return math.ceil(Fraction(repr(participation)) * clients)


class Participation:
    """Which clients take part in each round (`--participation F`): ⌈F·M⌉ of the M, drawn without replacement.

    The draws come from a NumPy generator of their own, seeded with the run seed and a fixed tag, not from
    the process-wide generators: sampling changes no other random number the run draws (initialisation,
    dropout, a method's own sampling), and a run samples the same clients on every re-run, alone or not.
    At F = 1 nothing is drawn and every client takes part, so a run equals one without the option."""

    def __init__(self, participation: float, clients: int, seed: int) -> None:
        if not 0 < participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {participation}")
        self.clients = clients
        self.count = sampled_count(participation, clients)
        self._generator = np.random.default_rng([seed, _PARTICIPATION_STREAM]) if self.count < clients else None

    def next_round(self) -> list[int]:
        """The ids taking part in the next round, ascending."""
        if self._generator is None:
            return list(range(self.clients))
        return sorted(int(i) for i in self._generator.choice(self.clients, size=self.count, replace=False))
