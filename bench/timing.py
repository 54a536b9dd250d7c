"""Shared timing for the micro-benchmarks in bench/: median milliseconds of a forward and backward."""

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
