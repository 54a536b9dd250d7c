"""Dropout with `F.dropout`'s numbers, drawn twice as fast on a CPU.

On a CPU, `F.dropout(x, p)` multiplies x by a mask it draws with `bernoulli_(1 - p)`: one float64
uniform per element from the current generator, compared with 1 - p, element by element in a serial
loop, then divides the mask by 1 - p. `torch.rand(..., dtype=float64) < 1 - p` draws the same
uniforms from the same generator in one vectorised pass: the same mask and the same generator state
afterwards, in half the time (tests/test_dropout.py checks both against F.dropout). Dropout is a
large share of some rounds (FedICI's and FedSSA's UniFilter drop out every entry of their
[K+1, N, F] bases), and the batched path (gfl_bench/core/batched.py) draws every client's masks this way.

Elsewhere (CUDA's Philox kernels) and for inputs not laid out row-major, `F.dropout` itself runs:
only there would the order of the draws differ.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

# Elements drawn per pass on a CPU: the float64 uniforms (512 KB) stay in cache while they are compared
# and written out as the mask; consecutive draws are the draws of one call of their total size.
CHUNK = 2**16


def dropout_mask(
    shape: tuple[int, ...], keep: float, device: torch.device, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The mask `F.dropout` multiplies by (1/keep where kept, else 0), drawn as it draws it from the current stream."""
    if device.type != "cpu":
        return torch.empty(shape, device=device, dtype=dtype).bernoulli_(keep).div_(keep)
    mask = torch.empty(shape, dtype=dtype)
    flat = mask.view(-1)
    for start in range(0, flat.numel(), CHUNK):
        part = flat[start : start + CHUNK]
        part.copy_(torch.rand(part.numel(), dtype=torch.float64) < keep).div_(keep)
    return mask


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """`F.dropout(x, p, training)`, the same numbers and random stream, with the mask from `dropout_mask` on a CPU."""
    if x.device.type != "cpu" or not x.is_contiguous() or not 0.0 < p < 1.0 or not training or x.numel() == 0:
        return F.dropout(x, p, training)  # its own checks and edge cases (p = 0, p = 1, eval) draw nothing
    return x * dropout_mask(tuple(x.shape), 1.0 - p, x.device, x.dtype)
