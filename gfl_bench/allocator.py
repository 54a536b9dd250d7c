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
"""

from __future__ import annotations

import ctypes
import functools
import sys

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_MAX = -4


@functools.cache
def keep_freed_memory() -> bool:
    """Serve large blocks from the heap and never trim it (glibc only; elsewhere nothing changes).
    Returns whether the allocator took the settings. Process-wide and idempotent."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # No mmap for new blocks (glibc still falls back to it where the heap cannot grow), and no trim of
    # the heap's free top: freed blocks are reused by the next allocation of that size.
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
