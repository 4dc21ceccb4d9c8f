"""CUDA kernels: bit-identical to the CPU kernels for the same seed, and 64-bit indexing.

These need a GPU; without one they are skipped with that reason (scripts/gpu_check.sh runs them
on a lent GPU). The CPU kernels run the very same per-element functions (quant_math.h).
"""

import pytest
import torch

from actbench.kernels import ops

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: CUDA kernels cannot run on this machine"),
]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _x(shape, dtype):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 2 - 1).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 1000), (1, 256), (5, 7, 9, 11), (2, 3), (64, 3, 32, 32)])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_cuda_codes_identical_to_cpu(shape, dtype, bits):
    x = _x(shape, dtype)
    cpu = ops.quantize(x, bits, seed_offset=(42, 7))
    gpu = ops.quantize(x.cuda(), bits, seed_offset=(42, 7))
    mn, mx = ops.group_minmax(x)
    gmn, gmx = ops.group_minmax(x.cuda())
    assert torch.equal(mn, gmn.cpu()) and torch.equal(mx, gmx.cpu())
    assert torch.equal(cpu.codes, gpu.codes.cpu())
    assert torch.equal(cpu.lo.view(torch.int16), gpu.lo.cpu().view(torch.int16))
    assert torch.equal(cpu.scale.view(torch.int16), gpu.scale.cpu().view(torch.int16))
    assert torch.equal(ops.dequantize(cpu), ops.dequantize(gpu).cpu())


def test_cuda_mixed_bits_identical_to_cpu():
    x = _x((16, 3, 17, 19), torch.float32)
    bits = torch.randint(1, 9, (16,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    cpu = ops.quantize(x, bits, seed_offset=(5, 5))
    gpu = ops.quantize(x.cuda(), bits, seed_offset=(5, 5))
    assert torch.equal(cpu.codes, gpu.codes.cpu())
    assert torch.equal(ops.dequantize(cpu), ops.dequantize(gpu).cpu())


def test_cuda_masks_and_pool_identical_to_cpu():
    x = _x((4, 8, 33, 31), torch.float32)
    mask = x > 0
    assert torch.equal(ops.pack_mask(mask), ops.pack_mask(mask.cuda()).cpu())
    assert torch.equal(ops.unpack_mask(ops.pack_mask(mask).cuda(), mask.shape).cpu(), mask)
    out, arg = ops.max_pool2d_with_argmax(x, (3, 3), (2, 2), (1, 1))
    gout, garg = ops.max_pool2d_with_argmax(x.cuda(), (3, 3), (2, 2), (1, 1))
    assert torch.equal(out, gout.cpu()) and torch.equal(arg, garg.cpu())
    grad = torch.randn_like(out)
    gin = ops.max_pool2d_backward(grad, arg, x.shape, (3, 3), (2, 2), (1, 1))
    ggin = ops.max_pool2d_backward(grad.cuda(), garg, x.shape, (3, 3), (2, 2), (1, 1))
    assert torch.equal(gin, ggin.cpu())  # both gather in the same order: bit-identical sums


def test_cuda_batch_over_65535():
    """Upstream launched one block per sample and broke past 65,535; we use grid-stride loops."""
    x = torch.randn(70_000, 300, generator=torch.Generator().manual_seed(0))
    gpu = ops.quantize(x.cuda(), 2, seed_offset=(1, 2))
    cpu = ops.quantize(x, 2, seed_offset=(1, 2))
    assert torch.equal(gpu.codes.cpu(), cpu.codes)
    assert torch.equal(ops.dequantize(gpu).cpu(), ops.dequantize(cpu))


def test_cuda_tensor_over_2_pow_31_values():
    n = 2**31 + 2**20
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * 2**30:
        pytest.skip(f"needs 12 GiB of free GPU memory for a {n}-value tensor, {free / 2**30:.1f} GiB free")
    x = torch.randn(2, n // 2, device="cuda", dtype=torch.float16)
    p = ops.quantize(x, 2, seed_offset=(3, 4))
    assert p.codes.numel() == 2 * ((n // 2 + 255) // 256) * 256 * 2 // 8
    y = ops.dequantize(p)
    # The last values of the second sample sit past 2^31: they must be reconstructed, not garbage.
    tail, tail_hat = x[1, -4096:].float(), y[1, -4096:].float()
    scale = p.scale[1, -16:].float().repeat_interleave(256)
    assert bool(((tail_hat - tail).abs() <= 1 / scale + 1e-2).all())
    mask = torch.ones(n, dtype=torch.bool, device="cuda")
    assert int(ops.pack_mask(mask)[-1]) == 255


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_fused_and_given_minmax_codes_identical(dtype):
    """The one-pass quantizer (ranges taken in the quantizing warp) and the given-range path agree."""
    x = _x((6, 5, 37), dtype)
    minmax = ops.group_minmax(x.cuda())
    fused = ops.quantize(x.cuda(), 2, seed_offset=(8, 9))
    given = ops.quantize(x.cuda(), 2, seed_offset=(8, 9), minmax=minmax)
    assert torch.equal(fused.codes, given.codes) and torch.equal(fused.lo.view(torch.int16), given.lo.view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_float_mask_and_apply_mask_identical_to_cpu(dtype):
    x = _x((4, 8, 33, 31), dtype)
    y = torch.relu(x)
    packed = ops.pack_mask(y)
    assert torch.equal(packed, ops.pack_mask(y.cuda()).cpu())
    grad = _x(y.shape, dtype)
    assert torch.equal(ops.apply_mask(grad, packed, 1.5), ops.apply_mask(grad.cuda(), packed.cuda(), 1.5).cpu())


@pytest.mark.parametrize("group_size", [40, 64, 512, 1032])
def test_cuda_group_sizes_identical_to_cpu(group_size):
    """Groups of up to 256 values keep each lane's chunk in registers between the range and the
    codes; larger groups reload their chunks. Both give the CPU's codes, fused and given a range."""
    x = _x((5, 3, 301), torch.float32)
    cpu = ops.quantize(x, 4, group_size=group_size, seed_offset=(11, 12))
    gpu = ops.quantize(x.cuda(), 4, group_size=group_size, seed_offset=(11, 12))
    given = ops.quantize(x.cuda(), 4, group_size=group_size, seed_offset=(11, 12),
                         minmax=ops.group_minmax(x.cuda(), group_size=group_size))
    assert torch.equal(cpu.codes, gpu.codes.cpu()) and torch.equal(cpu.codes, given.codes.cpu())
    assert torch.equal(ops.dequantize(cpu), ops.dequantize(gpu).cpu())


@pytest.mark.parametrize("numel", [1, 7, 31, 33, 111, 4097])
def test_cuda_masks_of_any_length_identical_to_cpu(numel):
    """A warp packs 32 values into 4 bytes; a last warp with fewer values writes only its bytes."""
    y = torch.relu(_x((numel,), torch.float32))
    packed = ops.pack_mask(y)
    assert torch.equal(packed, ops.pack_mask(y.cuda()).cpu())
    assert torch.equal(packed, ops.pack_mask((y > 0).cuda()).cpu())
    assert torch.equal(ops.unpack_mask(packed.cuda(), y.shape).cpu(), y > 0)
    grad = _x((numel,), torch.float32)
    assert torch.equal(ops.apply_mask(grad, packed, 1.0), ops.apply_mask(grad.cuda(), packed.cuda(), 1.0).cpu())


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", [
    ((3, 3), (2, 2), (1, 1), (1, 1), False), ((2, 2), (2, 2), (0, 0), (1, 1), False),
    ((3, 3), (2, 2), (0, 0), (1, 1), True), ((3, 2), (1, 2), (1, 0), (2, 1), False),
    ((5, 5), (3, 3), (2, 2), (1, 1), True),
])
def test_cuda_max_pool_identical_to_cpu(kernel, stride, padding, dilation, ceil_mode):
    x = torch.randint(-1, 2, (2, 3, 29, 300), generator=torch.Generator().manual_seed(4)).float()  # many ties
    out, arg = ops.max_pool2d_with_argmax(x, kernel, stride, padding, dilation, ceil_mode)
    gout, garg = ops.max_pool2d_with_argmax(x.cuda(), kernel, stride, padding, dilation, ceil_mode)
    assert torch.equal(out, gout.cpu()) and torch.equal(arg, garg.cpu())
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)) * 1e3
    gin = ops.max_pool2d_backward(grad, arg, x.shape, kernel, stride, padding, dilation)
    ggin = ops.max_pool2d_backward(grad.cuda(), garg, x.shape, kernel, stride, padding, dilation)
    assert torch.equal(gin, ggin.cpu())
    # an argmax the forward did not make (past the window, into the padding): both add only what lies inside
    noise = torch.randint(-128, 128, out.shape, generator=torch.Generator().manual_seed(6), dtype=torch.int8)
    gin = ops.max_pool2d_backward(grad, noise, x.shape, kernel, stride, padding, dilation)
    ggin = ops.max_pool2d_backward(grad.cuda(), noise.cuda(), x.shape, kernel, stride, padding, dilation)
    assert torch.equal(gin, ggin.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_apply_mask_of_an_offset_view_identical_to_cpu(dtype):
    """apply_mask loads a mask byte's 8 gradient values with 16-byte loads where they are aligned: a
    gradient that starts 3 values into its storage is not, so its values go one by one, same result."""
    numel = 4 * 8 * 33
    base = _x((numel + 3,), dtype)
    grad, grad_gpu = base[3:], base.cuda()[3:]  # .cuda() of the view would copy it to an aligned start
    assert grad_gpu.data_ptr() % 16 != 0
    packed = ops.pack_mask(torch.relu(_x((2, numel // 2), dtype)).flatten())
    assert torch.equal(ops.apply_mask(grad, packed, 0.5), ops.apply_mask(grad_gpu, packed.cuda(), 0.5).cpu())
