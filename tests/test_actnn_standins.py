"""Pure-torch stand-ins for the extension's mask, max-pool and allocation ops, for the ActNN tests.

The ActNN code always calls ``actbench.kernels.ops`` (the compiled extension); while the extension cannot
be loaded (not built yet, no compiler), the ActNN tests patch these stand-ins into ``ops`` so they
still exercise the layers. When the extension loads, the tests here check the stand-ins against it,
so a test that passed on stand-ins means the same with the real ops.
"""

from __future__ import annotations

import functools
import logging
import math
import os

import pytest
import torch
import torch.nn.functional as F

from actbench.kernels import ops

log = logging.getLogger(__name__)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    flat = mask.reshape(-1).to(torch.uint8)
    flat = F.pad(flat, (0, (-flat.numel()) % 8)).reshape(-1, 8).to(torch.int64)
    return (flat << torch.arange(8, device=flat.device)).sum(1).to(torch.uint8)


def unpack_mask(packed: torch.Tensor, shape) -> torch.Tensor:
    n = math.prod(shape)
    bits = (packed.to(torch.int64)[:, None] >> torch.arange(8, device=packed.device)) & 1
    return bits.reshape(-1)[:n].reshape(tuple(shape)).bool()


def max_pool2d_with_argmax(x, kernel_size, stride, padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    out, idx = F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
    w = x.shape[-1]
    oh, ow = out.shape[-2:]
    row, col = idx // w, idx % w
    oy = torch.arange(oh, device=x.device)[:, None] * stride[0] - padding[0]
    ox = torch.arange(ow, device=x.device)[None, :] * stride[1] - padding[1]
    ky, kx = (row - oy) // dilation[0], (col - ox) // dilation[1]
    return out, (ky * kernel_size[1] + kx).to(torch.int8)


def max_pool2d_backward(grad_out, argmax, input_shape, kernel_size, stride, padding=(0, 0), dilation=(1, 1)):
    h, w = input_shape[-2:]
    oh, ow = grad_out.shape[-2:]
    a = argmax.to(torch.int64)
    ky, kx = a // kernel_size[1], a % kernel_size[1]
    row = torch.arange(oh, device=a.device)[:, None] * stride[0] - padding[0] + ky * dilation[0]
    col = torch.arange(ow, device=a.device)[None, :] * stride[1] - padding[1] + kx * dilation[1]
    flat_idx = (row * w + col).reshape(*a.shape[:-2], -1)
    gx = torch.zeros((*grad_out.shape[:-2], h * w), dtype=grad_out.dtype, device=grad_out.device)
    gx.scatter_add_(-1, flat_idx, grad_out.reshape(*grad_out.shape[:-2], -1))
    return gx.reshape(tuple(input_shape))


def allocate_bits(cost, weight, target, min_bits=1, max_bits=8):
    cost = cost.to(torch.float64)
    weight = weight.to(torch.float64)
    bits = torch.full(cost.shape, max_bits, dtype=torch.int64)
    var = lambda b: cost / ((2.0 ** b) - 1) ** 2  # noqa: E731
    while float((weight * bits).sum()) > target + 1e-9:
        can = bits > min_bits
        if not bool(can.any()):
            break
        delta = (var(bits - 1) - var(bits)) / weight
        delta = torch.where(can, delta, torch.inf)
        bits[int(torch.argmin(delta))] -= 1
    return bits.to(torch.int32)


STANDINS = {
    "pack_mask": pack_mask,
    "unpack_mask": unpack_mask,
    "max_pool2d_with_argmax": max_pool2d_with_argmax,
    "max_pool2d_backward": max_pool2d_backward,
    "allocate_bits": allocate_bits,
}


@functools.cache
def extension_available() -> bool:
    """Whether ActNN tests run on the compiled extension (the default: it must load).

    Only ACTBENCH_TEST_STANDINS=1 switches to the pure-torch stand-ins, to exercise ActNN on a
    machine without a compiler; a failing build is an error, never a silent fallback.
    """
    if os.environ.get("ACTBENCH_TEST_STANDINS") == "1":
        return False
    ops.ensure_loaded()
    return True


def quant_backend() -> str:
    """The quantize backend for ActNN tests: the extension when it loads, else the oracle."""
    return "extension" if extension_available() else "oracle"


def patch_ops(monkeypatch: pytest.MonkeyPatch) -> str:
    """Patch stand-ins into ``actbench.kernels.ops`` when asked (ACTBENCH_TEST_STANDINS=1); returns the backend."""
    if not extension_available():
        for name, fn in STANDINS.items():
            monkeypatch.setattr(ops, name, fn)
    return quant_backend()


needs_extension = pytest.mark.skipif("not extension_available()", reason="compiled extension unavailable")


@pytest.mark.skipif(not extension_available(), reason="compiled extension unavailable: nothing to compare with")
def test_standins_match_extension():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(3, 5, 7, generator=g) > 0.5
    assert torch.equal(pack_mask(mask), ops.pack_mask(mask))
    assert torch.equal(unpack_mask(ops.pack_mask(mask), mask.shape), mask)
    x = torch.randn(2, 3, 11, 13, generator=g)
    for k, s, p, c in [((3, 3), (2, 2), (1, 1), False), ((2, 2), (2, 2), (0, 0), True)]:
        out, am = ops.max_pool2d_with_argmax(x, k, s, p, (1, 1), c)
        out2, am2 = max_pool2d_with_argmax(x, k, s, p, (1, 1), c)
        assert torch.equal(out, out2) and torch.equal(am, am2)
        go = torch.randn(out.shape, generator=g)
        torch.testing.assert_close(
            ops.max_pool2d_backward(go, am, x.shape, k, s, p), max_pool2d_backward(go, am2, x.shape, k, s, p)
        )
    cost = torch.rand(12, generator=g, dtype=torch.float64)
    weight = torch.randint(1, 5, (12,), generator=g).double()
    target = 2.0 * float(weight.sum())
    assert torch.equal(ops.allocate_bits(cost, weight, target), allocate_bits(cost, weight, target))


def test_standin_maxpool_matches_torch_gradient():
    """The stand-in argmax encodes the window position exactly (so pool tests mean something)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 9, 10, generator=g, requires_grad=True)
    k, s, p = (3, 3), (2, 2), (1, 1)
    out = F.max_pool2d(x, k, s, p, ceil_mode=True)
    go = torch.randn(out.shape, generator=g)
    (ref,) = torch.autograd.grad(out, x, go)
    out2, am = max_pool2d_with_argmax(x.detach(), k, s, p, (1, 1), True)
    assert torch.equal(out, out2)
    assert int(am.max()) < 9 and int(am.min()) >= 0
    torch.testing.assert_close(max_pool2d_backward(go, am, x.shape, k, s, p), ref)
