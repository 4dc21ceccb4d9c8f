"""Every op passes torch.library.opcheck and runs on the meta device with exact shapes.

A rule lives only if a test enforces it: the sample table must name every op in ops.OPS.
"""

import pytest
import torch

from actbench.kernels import extension

from actbench.kernels import ops


def _samples(device: str) -> dict[str, list[tuple]]:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 5, 70, generator=g)).to(device)
    mn, mx = ops.group_minmax(x)
    bits = torch.tensor([1, 3, 8], dtype=torch.int32, device=device)
    codes, lo, scale = torch.ops.actbench.quantize(x, mn, mx, 2, 256, 11, 3)
    mcodes, mlo, mscale = torch.ops.actbench.quantize_mixed(x, mn, mx, bits, 12, 256, 11, 3)
    mask = (x > 0).to(device)
    empty = x.new_empty((0,), dtype=torch.float32)
    img = torch.randn(2, 3, 9, 8, generator=g).to(device)
    pooled, arg = torch.ops.actbench.max_pool2d_with_argmax(img, [3, 3], [2, 2], [1, 1], [1, 1], False)
    return {
        "group_minmax": [(x, 256), (x.half(), 64)],
        "quantize": [(x, mn, mx, 2, 256, 11, 3), (x.bfloat16(), mn, mx, 8, 256, 1, 0), (x, empty, empty, 4, 64, 5, 2)],
        "quantize_mixed": [(x, mn, mx, bits, 12, 256, 11, 3)],
        "dequantize": [(codes, lo, scale, 2, 256, list(x.shape), torch.float32)],
        "dequantize_mixed": [(mcodes, mlo, mscale, bits, 256, list(x.shape), torch.float16)],
        "pack_mask": [(mask,), (x.relu(),), (x.half(),)],
        "unpack_mask": [(ops.pack_mask(mask), list(mask.shape))],
        "apply_mask": [(torch.randn(x.shape, generator=g).to(device), ops.pack_mask(mask), 1.0),
                       (x.bfloat16(), ops.pack_mask(mask), 2.0)],
        "max_pool2d_with_argmax": [(img, [3, 3], [2, 2], [1, 1], [1, 1], False), (img, [2, 2], [2, 2], [0, 0], [1, 1], True)],
        "max_pool2d_backward": [(torch.randn_like(pooled), arg, list(img.shape), [3, 3], [2, 2], [1, 1], [1, 1])],
        "allocate_bits": [
            (torch.rand(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64), 12.0, 1, 8)
        ] if device == "cpu" else [],
    }


def test_every_op_has_opcheck_samples():
    ops.ensure_loaded()
    samples = _samples("cpu")
    assert set(samples) == set(ops.OPS)
    assert all(samples[name] for name in ops.OPS)


@pytest.mark.parametrize("name", ops.OPS)
def test_opcheck(name):
    ops.ensure_loaded()
    op = getattr(torch.ops.actbench, name).default
    for args in _samples("cpu")[name]:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("name", [op for op in ops.OPS if op != "allocate_bits"])
def test_meta_shapes_equal_real_shapes(name):
    """The fake kernels give exactly the shapes and dtypes of the real CPU outputs."""
    op = getattr(torch.ops.actbench, name).default
    for args in _samples("cpu")[name]:
        real = op(*args)
        meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*meta_args)
        real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
        for r, f in zip(real, fake):
            assert f.device.type == "meta" and f.shape == r.shape and f.dtype == r.dtype


def test_quantize_wrapper_on_meta_device_sizes_storage_exactly():
    x = torch.randn(4, 3, 20, 20)
    real = ops.quantize(x, 2)
    fake = ops.quantize(x.to("meta"), 2)
    assert fake.codes.device.type == "meta" and fake.nbytes == real.nbytes
    assert ops.dequantize(fake).shape == x.shape


def test_cuda_kernel_registered_for_every_op_when_built_with_nvcc():
    """CI compiles the CUDA sources (nvcc is installed) even without a GPU: the kernels must be there."""
    plan = extension.load()
    if not plan.with_cuda:
        pytest.skip("extension built without CUDA: no nvcc found on this machine")
    registered = ops.cuda_kernels_registered()
    assert registered.pop("allocate_bits") is False  # CPU-only by design (docs/design.md §2 runs it on the host)
    assert all(registered.values()), registered
