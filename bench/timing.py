"""Shared timing for bench/: median milliseconds of a forward and backward; seconds between round ends."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def forward_backward_ms(forward: Callable[[], torch.Tensor], leaf: torch.Tensor, repeats: int, warmup: int) -> float:
    """Median ms of `forward().sum().backward()` into `leaf` over `repeats` runs after `warmup` (CUDA synchronised)."""
    sync = torch.cuda.synchronize if leaf.is_cuda else (lambda: None)
    times = []
    for _ in range(repeats + warmup):
        leaf.grad = None
        sync()
        start = time.perf_counter()
        forward().sum().backward()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[warmup:])


class RoundClock:
    """Wall and CPU time between the ends of consecutive rounds (each end: right after the round's evaluation).

    The same boundaries on both sides; the first round's share of set-up work is taken by the warm-up.
    CPU time (`time.process_time`, this process only) is less disturbed by other jobs on a busy machine.
    """

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.start()

    def start(self) -> None:
        self.wall, self.cpu = [time.perf_counter()], [time.process_time()]

    def mark(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def rounds(self) -> dict[str, list[float]]:
        return {
            "seconds": [b - a for a, b in zip(self.wall, self.wall[1:])],
            "cpu": [b - a for a, b in zip(self.cpu, self.cpu[1:])],
        }
