"""1-bit masks, max pool with int8 argmax, and the greedy bit allocator (CPU kernels)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from actbench.kernels import ops


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (3, 5, 7), (2, 64, 9, 9)])
def test_mask_round_trip(shape):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(0)) > 0.5
    packed = ops.pack_mask(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == (mask.numel() + 7) // 8
    assert torch.equal(ops.unpack_mask(packed, shape), mask)


def test_mask_bit_order_is_lsb_first():
    mask = torch.tensor([True, False, False, False, False, False, False, False, False, True])
    assert ops.pack_mask(mask).tolist() == [1, 2]


def test_mask_errors():
    with pytest.raises(TypeError, match="mask must be bool, float32, float16 or bfloat16, got torch.int64"):
        ops.pack_mask(torch.ones(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="mask must be bool, float32, float16 or bfloat16, got Double"):
        torch.ops.actbench.pack_mask(torch.ones(4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="apply_mask: packed must be uint8 \\[2\\]"):
        ops.apply_mask(torch.ones(3, 5), torch.zeros(1, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="packed must be uint8 \\[2\\] for shape \\[3, 5\\]"):
        ops.unpack_mask(torch.zeros(1, dtype=torch.uint8), (3, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1,), (13,), (2, 64, 9, 9), (8 * 8192 * 3 + 13,)])
def test_float_mask_is_value_above_zero(shape, dtype):
    """A float tensor packs as value > 0 (a ReLU's output): NaN, -0 and 0 give clear bits, the smallest
    denormal and +inf set ones. Special values sit everywhere, so the vector blocks (eight values a byte,
    several parallel tasks of 8,192 bytes) and the scalar tail all meet them."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g).to(dtype)
    flat = x.view(-1)
    specials = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1e-45, -1e-45]).to(dtype)
    at = torch.rand(flat.shape, generator=g) < 0.3
    flat[at] = specials[torch.randint(len(specials), (int(at.sum()),), generator=g)]
    flat[0] = float("nan")
    if x.numel() > 2:
        flat[1], flat[2] = -0.0, 0.0
    assert torch.equal(ops.pack_mask(x), ops.pack_mask(x > 0))
    assert torch.equal(ops.pack_mask(torch.relu(x)), ops.pack_mask(x > 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 1.25])
def test_apply_mask_is_thresholds_select(dtype, scale):
    """apply_mask = where(mask, grad * scale, 0): bit-equal to threshold_backward at scale 1, NaN grads
    where the mask is clear give 0."""
    g = torch.Generator().manual_seed(4)
    y = torch.relu(torch.randn(3, 7, 11, generator=g)).to(dtype)
    grad = torch.randn(y.shape, generator=g).to(dtype)
    grad.view(-1)[(y.view(-1) == 0).nonzero()[0]] = float("nan")
    got = ops.apply_mask(grad, ops.pack_mask(y), scale)
    expected = torch.where(y > 0, grad * scale, torch.zeros((), dtype=dtype))
    assert torch.equal(got, expected)
    if scale == 1.0:
        assert torch.equal(got, torch.ops.aten.threshold_backward(grad, y, 0))


POOLS = [
    # kernel, stride, padding, dilation, ceil_mode
    ((3, 3), (2, 2), (1, 1), (1, 1), False),  # ResNet stem
    ((2, 2), (2, 2), (0, 0), (1, 1), False),  # VGG
    ((3, 3), (2, 2), (0, 0), (1, 1), True),  # SqueezeNet / GoogLeNet (ceil_mode)
    ((3, 2), (1, 2), (1, 0), (2, 1), False),  # dilation, asymmetric
    ((5, 5), (3, 3), (2, 2), (1, 1), True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", POOLS)
def test_max_pool_matches_torch(kernel, stride, padding, dilation, ceil_mode, dtype):
    x = torch.randn(2, 3, 13, 11, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    ref, idx = F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    out, arg = ops.max_pool2d_with_argmax(x.detach(), kernel, stride, padding, dilation, ceil_mode)
    assert arg.dtype == torch.int8 and out.shape == ref.shape
    assert torch.equal(out, ref.detach())
    # Same winner: translate the window index into torch's flat input index.
    oh = torch.arange(out.shape[2]).view(-1, 1)
    ow = torch.arange(out.shape[3]).view(1, -1)
    h = oh * stride[0] - padding[0] + (arg.long() // kernel[1]) * dilation[0]
    w = ow * stride[1] - padding[1] + (arg.long() % kernel[1]) * dilation[1]
    assert torch.equal(h * x.shape[3] + w, idx)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    (expected,) = torch.autograd.grad(ref, x, grad)
    got = ops.max_pool2d_backward(grad, arg, x.shape, kernel, stride, padding, dilation)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # overlapping windows sum in another order
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", POOLS)
def test_max_pool_ties_and_nans_pick_torchs_winner_on_wide_rows(kernel, stride, padding, dilation, ceil_mode, dtype):
    """Rows wider than one vectorized stretch (256 outputs), values drawn from {-1, 0, 1} so most
    windows tie, and NaNs: the first maximum wins, or the last NaN, as in torch."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-1, 2, (1, 2, 11, 800), generator=gen).float()
    x[torch.rand(x.shape, generator=gen) < 0.02] = float("nan")
    x = x.to(dtype)
    ref, idx = F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    out, arg = ops.max_pool2d_with_argmax(x, kernel, stride, padding, dilation, ceil_mode)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(), ref.nan_to_num())
    oh = torch.arange(out.shape[2]).view(-1, 1)
    ow = torch.arange(out.shape[3]).view(1, -1)
    h = oh * stride[0] - padding[0] + (arg.long() // kernel[1]) * dilation[0]
    w = ow * stride[1] - padding[1] + (arg.long() % kernel[1]) * dilation[1]
    assert torch.equal(h * x.shape[3] + w, idx)


def test_max_pool_nan_propagates_like_torch():
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 1] = float("nan")
    out, _ = ops.max_pool2d_with_argmax(x, (2, 2), (2, 2))
    ref = F.max_pool2d(x, 2, 2)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(out.nan_to_num(), ref.nan_to_num())


def test_max_pool_3d_input_and_bad_window():
    x = torch.randn(4, 9, 9)
    out, arg = ops.max_pool2d_with_argmax(x, (3, 3), (2, 2), (1, 1))
    assert torch.equal(out, F.max_pool2d(x, 3, 2, 1))
    with pytest.raises(RuntimeError, match="at most 127 values"):
        ops.max_pool2d_with_argmax(torch.randn(1, 1, 20, 20), (12, 12), (1, 1))
    with pytest.raises(RuntimeError, match="padding must be at most half"):
        ops.max_pool2d_with_argmax(x, (2, 2), (2, 2), (2, 2))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_max_pool_backward_refuses_a_grad_that_is_not_the_inputs_pool_output(device):
    """More planes in input_shape than grad_out holds read past grad_out's end (exit 139 before); a
    larger grad_out than the input's windows is no pool output either. Both are one-line errors, on
    the kernel and on the fake kernel alike."""
    x = torch.randn(2, 3, 16, 16, device=device)
    grad = torch.randn(2, 3, 8, 8, device=device)
    arg = torch.zeros(2, 3, 8, 8, dtype=torch.int8, device=device)
    assert ops.max_pool2d_backward(grad, arg, x.shape, (3, 3), (2, 2), (1, 1)).shape == x.shape
    ceil_grad, ceil_arg = torch.zeros(2, 3, 9, 9, device=device), torch.zeros(2, 3, 9, 9, dtype=torch.int8, device=device)
    assert ops.max_pool2d_backward(ceil_grad, ceil_arg, x.shape, (3, 3), (2, 2), (1, 1)).shape == x.shape
    for shape, g, a in (((64, 64, 16, 16), grad, arg),
                        (x.shape, torch.zeros(2, 3, 40, 40, device=device),
                         torch.zeros(2, 3, 40, 40, dtype=torch.int8, device=device)),
                        (x.shape, torch.zeros(2, 3, 8, 9, device=device),
                         torch.zeros(2, 3, 8, 9, dtype=torch.int8, device=device))):
        with pytest.raises(RuntimeError, match=r"is not a max pool output of input .* with ceil_mode"):
            ops.max_pool2d_backward(g, a, shape, (3, 3), (2, 2), (1, 1))


# ------------------------------------------------------------------------------------------------
# Greedy allocation.
# ------------------------------------------------------------------------------------------------


def _objective(cost, bits):
    return sum(c / (2**b - 1) ** 2 for c, b in zip(cost, bits))


def _brute_force(cost, weight, target, lo=1, hi=8):
    best = None
    for bits in itertools.product(range(lo, hi + 1), repeat=len(cost)):
        if sum(w * b for w, b in zip(weight, bits)) <= target:
            value = _objective(cost, bits)
            if best is None or value < best[0] - 1e-15:
                best = (value, bits)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_allocation_equals_brute_force_for_equal_weights(seed):
    """Equal weights: the objective is separable and convex per item, so greedy is optimal."""
    g = torch.Generator().manual_seed(seed)
    k = 4
    cost = (torch.rand(k, generator=g, dtype=torch.float64) * 10) ** 3
    weight = torch.full((k,), 3.0, dtype=torch.float64)
    target = float(torch.randint(k, 6 * k, (), generator=g)) * 3.0
    bits = ops.allocate_bits(cost, weight, target)
    best_value, _ = _brute_force(cost.tolist(), weight.tolist(), target)
    assert float((weight * bits).sum()) <= target
    assert _objective(cost.tolist(), bits.tolist()) == pytest.approx(best_value, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_allocation_never_over_budget_and_close_to_optimal(seed):
    g = torch.Generator().manual_seed(100 + seed)
    k = 4
    cost = torch.rand(k, generator=g, dtype=torch.float64) * 100
    weight = torch.randint(1, 6, (k,), generator=g).to(torch.float64)
    target = float(weight.sum()) * float(torch.rand((), generator=g) * 6 + 1.5)
    bits = ops.allocate_bits(cost, weight, target)
    assert bits.dtype == torch.int32 and int(bits.min()) >= 1 and int(bits.max()) <= 8
    assert float((weight * bits).sum()) <= target
    best_value, _ = _brute_force(cost.tolist(), weight.tolist(), target)
    # Unequal weights make it a knapsack: greedy is a heuristic. It stays within 2x of the optimum
    # on these cases (an allocation that ignored cost would be off by orders of magnitude).
    assert _objective(cost.tolist(), bits.tolist()) <= 2 * best_value + 1e-12


def test_allocation_unit_weights_land_exactly_on_target():
    """docs/design.md §2: unit weights end at exactly max(N, floor(target * N)) total bits."""
    cost = torch.rand(64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for avg in (1.0, 1.25, 2.0, 2.7, 8.0):
        bits = ops.allocate_bits(cost, torch.ones(64, dtype=torch.float64), avg * 64)
        assert int(bits.sum()) == max(64, int(avg * 64))


def test_allocation_gives_sensitive_items_more_bits():
    cost = torch.tensor([1e6, 1.0, 1.0, 1.0], dtype=torch.float64)
    bits = ops.allocate_bits(cost, torch.ones(4, dtype=torch.float64), 8.0)
    assert int(bits[0]) > int(bits[1:].max())


def test_allocation_errors():
    one = torch.ones(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="target 2 is below the smallest possible total 3"):
        ops.allocate_bits(one, one, 2.0)
    with pytest.raises(RuntimeError, match=r"weight\[1\] must be finite and > 0, got 0"):
        ops.allocate_bits(one, torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), 10.0)
    with pytest.raises(RuntimeError, match="need 1 <= min_bits <= max_bits <= 8"):
        ops.allocate_bits(one, one, 10.0, min_bits=0)


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", POOLS)
def test_max_pool_backward_sums_in_the_gathers_order(kernel, stride, padding, dilation, ceil_mode):
    """Every input adds its windows' gradients in one fixed order (windows i, j ascending, from 0):
    the CPU kernel and the CUDA kernel's gather then agree bit for bit."""
    x = torch.randn(1, 2, 9, 8, generator=torch.Generator().manual_seed(5))
    out, arg = ops.max_pool2d_with_argmax(x, kernel, stride, padding, dilation, ceil_mode)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)) * 1e3
    got = ops.max_pool2d_backward(grad, arg, x.shape, kernel, stride, padding, dilation)
    assert torch.equal(got, _gathered(grad, arg, x.shape, kernel, stride, padding, dilation))


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", POOLS)
def test_max_pool_backward_of_any_argmax_adds_only_positions_inside_window_and_input(kernel, stride, padding,
                                                                                     dilation, ceil_mode):
    """An argmax the forward did not make (any int8: past the window, in the padding) must not write
    outside the gradient: the kernel adds only what the gather would, which crashed before (rc 139)."""
    x = torch.randn(3, 2, 9, 8, generator=torch.Generator().manual_seed(7))
    out, _ = ops.max_pool2d_with_argmax(x, kernel, stride, padding, dilation, ceil_mode)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(8))
    for seed in range(3):
        arg = torch.randint(-128, 128, out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int8)
        got = ops.max_pool2d_backward(grad, arg, x.shape, kernel, stride, padding, dilation)
        assert torch.equal(got, _gathered(grad, arg, x.shape, kernel, stride, padding, dilation))
    corners = torch.zeros_like(arg)  # every window's first position: the padding's, for the border windows
    got = ops.max_pool2d_backward(grad, corners, x.shape, kernel, stride, padding, dilation)
    assert torch.equal(got, _gathered(grad, corners, x.shape, kernel, stride, padding, dilation))


_GATHER_SOURCE = r"""
#include "actbench/quant_math.h"
// Every input-gradient value of a [planes, in_h, in_w] plane stack, by the header's pool_input_grad:
// what the CUDA kernel computes per thread, here in a host loop.
extern "C" void gather(const float* grad, const int8_t* arg, int64_t planes, int64_t in_h, int64_t in_w,
                       int64_t out_h, int64_t out_w, const int* k, float* out, int narrow) {
  actbench::Pool2d p{in_h, in_w, out_h, out_w, k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]};
  using F = actbench::Format<actbench::kF32>;
  for (int64_t c = 0; c < planes; ++c)
    for (int64_t h = 0; h < in_h; ++h)
      for (int64_t w = 0; w < in_w; ++w) {
        const float* g = grad + c * out_h * out_w;
        const int8_t* a = arg + c * out_h * out_w;
        out[(c * in_h + h) * in_w + w] =
            narrow ? actbench::pool_input_grad<F, float, int32_t>(g, a, p, int32_t(h), int32_t(w))
                   : actbench::pool_input_grad<F, float, int64_t>(g, a, p, h, w);
      }
}
"""


@pytest.fixture(scope="module")
def header_gather(tmp_path_factory):
    """The CUDA backward's per-value gather (quant_math.h), compiled for the host: a plain C function."""
    import ctypes
    import os
    import subprocess
    from pathlib import Path

    folder = tmp_path_factory.mktemp("gather")
    (folder / "gather.cpp").write_text(_GATHER_SOURCE)
    include = Path(ops.__file__).resolve().parents[2] / "csrc" / "include"
    subprocess.run([os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{include}",
                    str(folder / "gather.cpp"), "-o", str(folder / "gather.so")], check=True)
    return ctypes.CDLL(str(folder / "gather.so")).gather


@pytest.mark.parametrize("narrow", [True, False], ids=["int32", "int64"])
@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", POOLS)
def test_the_cuda_gathers_shared_function_equals_the_cpu_scatter_bit_for_bit(header_gather, narrow, kernel, stride,
                                                                             padding, dilation, ceil_mode):
    """pool_input_grad, which each CUDA thread runs, run here on the host: for the forward's argmax
    (ties, so windows share a winner) and for any int8 argmax, and gradients of magnitudes from 1e-4
    to 1e4 (so a sum in another order would differ), it gives the CPU kernel's gradient exactly."""
    import ctypes

    gen = torch.Generator().manual_seed(13)
    x = torch.randint(0, 3, (2, 3, 11, 10), generator=gen).float()  # many ties
    out, arg = ops.max_pool2d_with_argmax(x, kernel, stride, padding, dilation, ceil_mode)
    grad = torch.randn(out.shape, generator=gen) * 10.0 ** torch.randint(-4, 5, out.shape, generator=gen)
    params = (ctypes.c_int * 8)(*kernel, *stride, *padding, *dilation)
    any_arg = torch.randint(-128, 128, out.shape, generator=gen, dtype=torch.int8)
    for argmax in (arg, any_arg):
        got = torch.empty(x.shape)
        header_gather(ctypes.c_void_p(grad.data_ptr()), ctypes.c_void_p(argmax.data_ptr()), ctypes.c_int64(6),
                      *(ctypes.c_int64(v) for v in (*x.shape[2:], *out.shape[2:])), params,
                      ctypes.c_void_p(got.data_ptr()), ctypes.c_int(int(narrow)))
        expected = ops.max_pool2d_backward(grad, argmax, x.shape, kernel, stride, padding, dilation)
        assert torch.equal(got, expected)
        assert torch.equal(got, _gathered(grad, argmax, x.shape, kernel, stride, padding, dilation))


def _gathered(grad, arg, shape, kernel, stride, padding, dilation) -> torch.Tensor:
    """The input gradient as the CUDA kernel gathers it: per input, windows i, j ascending, from 0."""
    expected = torch.zeros(shape)
    n, channels, height, width = shape
    for b, c, h, w in itertools.product(range(n), range(channels), range(height), range(width)):
        acc = torch.zeros((), dtype=torch.float32)
        for i, j in itertools.product(range(kernel[0]), range(kernel[1])):
            hh, ww = h + padding[0] - i * dilation[0], w + padding[1] - j * dilation[1]
            if hh < 0 or ww < 0 or hh % stride[0] or ww % stride[1]:
                continue
            oh, ow = hh // stride[0], ww // stride[1]
            if oh < grad.shape[2] and ow < grad.shape[3] and arg[b, c, oh, ow] == i * kernel[1] + j:
                acc = acc + grad[b, c, oh, ow]
        expected[b, c, h, w] = acc
    return expected


def test_outputs_of_a_mib_and_more_hold_what_the_references_compute():
    """Outputs of 1 MiB and more have their pages mapped before the kernel writes them (docs/design.md
    §2, "Fresh outputs"); every op that makes one must still write all of it. Each output checked
    here is 1-8 MiB, at or above the threshold, and compared whole with the oracle or torch's own op
    (a mask packed from 32 MiB of fp32 is 1 MiB, checked by unpacking it)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(8, 64, 64, 64, generator=gen)  # 8 MiB of fp32
    ext = ops.quantize(x, 8, seed_offset=(3, 4))  # 8-bit codes: 2 MiB
    ref = ops.quantize(x, 8, seed_offset=(3, 4), backend="oracle")
    assert ext.codes.numel() >= 2**20 and torch.equal(ext.codes, ref.codes)
    assert torch.equal(ops.dequantize(ext), ops.dequantize(ref, backend="oracle"))
    y = torch.relu(x)
    packed = ops.pack_mask(y)
    assert torch.equal(ops.unpack_mask(packed, y.shape), y > 0)
    grad = torch.randn(x.shape, generator=gen)
    assert torch.equal(ops.apply_mask(grad, packed), torch.ops.aten.threshold_backward(grad, y, 0))
    big = torch.randn(32, 64, 64, 64, generator=gen)  # 32 MiB: a pool output of 8 MiB, its argmax 2 MiB
    big_packed = ops.pack_mask(torch.relu(big))
    assert big_packed.numel() == 2**20 and torch.equal(ops.unpack_mask(big_packed, big.shape), big > 0)
    kernel, stride, padding, dilation, ceil_mode = POOLS[0]
    ref_out, idx = torch.ops.aten.max_pool2d_with_indices(big, kernel, stride, padding, dilation, ceil_mode)
    out, arg = ops.max_pool2d_with_argmax(big, kernel, stride, padding, dilation, ceil_mode)
    assert arg.numel() >= 2**20 and torch.equal(out, ref_out)
    g = torch.randn(out.shape, generator=gen)
    expected = torch.ops.aten.max_pool2d_with_indices_backward(g, big, kernel, stride, padding, dilation, ceil_mode, idx)
    torch.testing.assert_close(ops.max_pool2d_backward(g, arg, big.shape, kernel, stride, padding, dilation),
                               expected, atol=1e-6, rtol=1e-6)
