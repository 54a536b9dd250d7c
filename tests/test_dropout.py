"""gfl_bench/backbones/dropout.py: F.dropout's numbers and random stream, from a faster draw on a CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from gflbench.backbones.dropout import CHUNK, dropout, dropout_mask

SHAPES = [(1,), (7, 3), (271, 64), (3, 50, 33), (2, CHUNK // 100 + 1, 100)]  # the last spans several chunks


@pytest.mark.parametrize("p", [0.1, 0.5, 0.65])
@pytest.mark.parametrize("shape", SHAPES)
def test_dropout_mask_is_f_dropouts_draw(p, shape):
    """The CPU mask is the one F.dropout draws at the same point of the stream, and it leaves the
    generator where F.dropout leaves it, so later draws agree too."""
    torch.manual_seed(11)
    expected = F.dropout(torch.ones(shape), p, training=True)
    after_expected = torch.get_rng_state()
    torch.manual_seed(11)
    mask = dropout_mask(shape, 1.0 - p, torch.device("cpu"))
    assert torch.equal(mask, expected)
    assert torch.equal(torch.get_rng_state(), after_expected)
    if mask.numel() > 20:  # both outcomes drawn: the comparison saw a real mask
        assert 0 < int((mask == 0).sum()) < mask.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.35, 0.5, 1.0])
@pytest.mark.parametrize("shape", SHAPES)
def test_dropout_is_f_dropout_in_values_gradient_and_stream(dtype, p, shape):
    """Output, gradient and generator state equal F.dropout's, at every rate including the drawless 0 and 1."""
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    torch.manual_seed(5)
    expected = F.dropout(x, p, training=True)
    state = torch.get_rng_state()
    (expected_grad,) = torch.autograd.grad((expected * 1.7).sum(), x)
    torch.manual_seed(5)
    actual = dropout(x, p, training=True)
    assert torch.equal(torch.get_rng_state(), state)
    (grad,) = torch.autograd.grad((actual * 1.7).sum(), x)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected) and torch.equal(grad, expected_grad)


def test_dropout_in_eval_mode_and_on_strided_inputs_is_f_dropout():
    x = torch.randn(40, 30)
    assert dropout(x, 0.5, training=False) is x  # F.dropout returns its input in eval mode too
    transposed = x.t()  # not row-major: F.dropout's own draw order
    torch.manual_seed(2)
    expected = F.dropout(transposed, 0.5, training=True)
    torch.manual_seed(2)
    assert torch.equal(dropout(transposed, 0.5, training=True), expected)
