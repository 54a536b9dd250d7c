"""gfl_bench/allocator.py: freed large tensors are reused from the heap instead of mapped afresh."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Page faults of the second of two fills of a freshly allocated 64 MB tensor (the first maps the pages).
PROBE = """
import resource, sys, torch
from gfl_bench.allocator import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else False
torch.empty(16 * 2**20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(16 * 2**20).fill_(2.0)
print(int(took), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return bool(int(out[0])), int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_tensor_is_reused_without_new_page_faults():
    took, kept = _faults("keep")
    if not took:
        pytest.skip("this libc has no mallopt (not glibc)")
    _, default = _faults("default")
    pages = 64 * 2**20 // 4096
    assert default > pages // 2  # glibc's default: the second block is mapped and zeroed again
    assert kept < pages // 20  # kept: the first block's pages are written again
