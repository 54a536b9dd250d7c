"""Keep freed CPU memory in the process instead of handing it back to the kernel after every tensor.

glibc's malloc serves every block above its mmap threshold (at most 32 MB) with a fresh `mmap` and
returns it with `munmap` when freed, so a loop that allocates and frees large tensors makes the
kernel map and zero the same pages again on every iteration. FedIIH's routing on a Minesweeper
client allocates [E, K, h] gathers of about 50 MB dozens of times per step: measured with `python
bench/round_time.py --dataset minesweeper --clients 10 --rounds 1 --methods fediih`, a round took
139 s, more than half of it system time, and 77 s with the blocks kept (docs/results.md, "Speed").
Only where memory comes from changes: every number stays the same. The cost is that a process keeps
its peak heap until it exits (peak memory, which the records report, grows by the fragmentation:
5.9 → 6.5 GB on that round).

Kept memory must stay bounded, and with glibc ≤ 2.37 it does not by itself: torch's CPU allocator asks
`posix_memalign` for 64-byte alignment, which requests a little more than the block, so a freed
block of exactly the size asked next cannot serve it. A loop that keeps a small tensor after each
large temporary (a metric, a clone) then leaves a trail of freed blocks that are never reused: a probe
of 60 × 64 MB iterations grew to 1.6 GB resident where glibc's default stays at 0.2 GB. So the
runner calls `release_excess_heap` after every CPU round: within a round freed blocks are reused,
and across rounds the freed memory kept resident is at most max(256 MB, the memory in use).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_MAX = -4
RELEASE_FLOOR = 256 * 2**20  # freed bytes a process may keep resident whatever it has in use


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (malloc.h, glibc ≥ 2.33): the heap's totals in bytes."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _glibc_function(name: str) -> Any | None:
    """The C library's function `name` on Linux, None where there is no such function (musl, other systems).
    Looked up once per process: the runner asks for `mallinfo2` after every round."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def keep_freed_memory() -> bool:
    """Serve large blocks from the heap and never trim it (glibc only; elsewhere nothing changes).
    Returns whether the allocator took the settings. Process-wide and idempotent."""
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # No mmap for new blocks (glibc still falls back to it where the heap cannot grow), and no trim of
    # the heap's free top: a freed block serves the later allocations that fit in it.
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def release_excess_heap(floor: int = RELEASE_FLOOR) -> bool:
    """Hand the pages of freed heap blocks back to the kernel (`malloc_trim`) when they exceed both
    `floor` and the bytes in use; returns whether it released. The blocks stay in the heap as address
    space, so a later allocation faults their pages in again, once: the price of the bound, paid only
    by runs whose freed memory outgrows it. Without glibc ≥ 2.33 (`mallinfo2`) it does nothing."""
    mallinfo2, malloc_trim = _glibc_function("mallinfo2"), _glibc_function("malloc_trim")
    if mallinfo2 is None or malloc_trim is None:
        return False
    mallinfo2.restype = _MallInfo2  # the cached function objects keep these; setting them again is free
    malloc_trim.argtypes, malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    info = mallinfo2()
    if info.fordblks <= max(floor, info.uordblks):
        return False
    malloc_trim(0)
    return True
