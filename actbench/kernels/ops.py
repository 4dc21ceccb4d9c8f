"""The only module that names ``torch.ops.actbench``: typed wrappers, fake kernels and the packed type.

Every op is a pure function: randomness enters as explicit ``seed`` and ``offset`` arguments, which
the wrappers here draw from a (CPU) ``torch.Generator`` — so ``opcheck`` passes and CPU and CUDA
kernels can be compared bit for bit. The layout is specified in :mod:`actbench.kernels.oracle`.

Backends: ``"extension"`` (the compiled ops, default) or ``"oracle"`` (pure PyTorch, slow),
chosen explicitly by the caller; a missing extension is an error, never a silent fallback.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch

from actbench.core import compat

from actbench.kernels import oracle

Backend = Literal["extension", "oracle"]
BACKENDS: tuple[str, ...] = ("extension", "oracle")
DEFAULT_GROUP_SIZE = 256
PACKABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
OPS = (
    "group_minmax",
    "quantize",
    "quantize_mixed",
    "dequantize",
    "dequantize_mixed",
    "pack_mask",
    "unpack_mask",
    "apply_mask",
    "max_pool2d_with_argmax",
    "max_pool2d_backward",
    "allocate_bits",
)


@functools.cache
def _lib():
    """Build (once, cached on disk) and load the extension, then register the fake kernels."""
    from actbench.kernels import extension

    extension.load()
    _register_fakes()
    return torch.ops.actbench


def cuda_kernels_registered() -> dict[str, bool]:
    """For each op, whether a CUDA kernel is registered in this process (after :func:`ensure_loaded`)."""
    return {op: compat.has_dispatch_kernel(f"actbench::{op}", "CUDA") for op in OPS}


def ensure_loaded() -> None:
    """Load the compiled extension now (building it on first use); raises ExtensionError."""
    _lib()


# ----------------------------------------------------------------------------------------------
# Fake (meta) kernels: shapes and dtypes only, so the ops run on FakeTensors and the meta device.
# ----------------------------------------------------------------------------------------------


def _groups(x: torch.Tensor, group_size: int):
    n = x.shape[0]
    per_sample = x.numel() // n if n else 0
    return n, (per_sample + group_size - 1) // group_size


def _check_fake_input(x: torch.Tensor, group_size: int, op: str) -> tuple[int, int]:
    """The kernels' checks of x and group_size (checks.h), for fake tensors; returns (N, G)."""
    torch._check(x.dtype in PACKABLE_DTYPES, lambda: f"actbench::{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    torch._check(x.dim() > 0 and x.numel() > 0, lambda: f"actbench::{op}: x must be non-empty with a batch dimension, got {tuple(x.shape)}")
    torch._check(group_size > 0 and group_size % 8 == 0, lambda: f"actbench::{op}: group_size must be a positive multiple of 8, got {group_size}")
    return _groups(x, group_size)


def _check_fake_minmax(mn: torch.Tensor, mx: torch.Tensor, n: int, g: int, op: str) -> None:
    """mn/mx: float32 [N, G], or both empty (the quantizer takes the ranges in its own pass)."""
    fused = mn.numel() == 0 and mx.numel() == 0
    for t in (mn, mx):
        torch._check(t.dtype == torch.float32 and (fused or tuple(t.shape) == (n, g)),
                     lambda: f"actbench::{op}: mn and mx must be float32 [{n}, {g}] (or both empty), got {t.dtype} {tuple(t.shape)}")


def _check_fake_packed(codes: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor, shape, group_size: int, op: str) -> None:
    n = shape[0]
    g = (math.prod(shape[1:]) + group_size - 1) // group_size
    torch._check(codes.dtype == torch.uint8 and codes.dim() == 1,
                 lambda: f"actbench::{op}: codes must be a 1-D uint8 tensor, got {codes.dtype} {tuple(codes.shape)}")
    for t in (lo, scale):
        torch._check(t.dtype == torch.bfloat16 and tuple(t.shape) == (n, g),
                     lambda: f"actbench::{op}: lo and scale must be bfloat16 [{n}, {g}], got {t.dtype} {tuple(t.shape)}")


def _check_fake_mask_bytes(packed: torch.Tensor, numel: int, op: str) -> None:
    torch._check(packed.dtype == torch.uint8 and packed.dim() == 1 and packed.numel() == (numel + 7) // 8,
                 lambda: f"actbench::{op}: packed must be uint8 [{(numel + 7) // 8}], got {packed.dtype} {tuple(packed.shape)}")


def _fake_group_minmax(x, group_size):
    n, g = _check_fake_input(x, group_size, "group_minmax")
    return x.new_empty((n, g), dtype=torch.float32), x.new_empty((n, g), dtype=torch.float32)


def _fake_quantize(x, mn, mx, bits, group_size, seed, offset):
    n, g = _check_fake_input(x, group_size, "quantize")
    torch._check(bits in (1, 2, 4, 8), lambda: f"actbench::quantize: bits must be 1, 2, 4 or 8, got {bits}")
    _check_fake_minmax(mn, mx, n, g, "quantize")
    codes = x.new_empty((n * g * group_size * bits // 8,), dtype=torch.uint8)
    return codes, x.new_empty((n, g), dtype=torch.bfloat16), x.new_empty((n, g), dtype=torch.bfloat16)


def _fake_quantize_mixed(x, mn, mx, bits, total_bits, group_size, seed, offset):
    n, g = _check_fake_input(x, group_size, "quantize_mixed")
    _check_fake_minmax(mn, mx, n, g, "quantize_mixed")
    torch._check(bits.dtype == torch.int32 and tuple(bits.shape) == (n,),
                 lambda: f"actbench::quantize_mixed: bits must be int32 [{n}], got {bits.dtype} {tuple(bits.shape)}")
    codes = x.new_empty((g * group_size * total_bits // 8,), dtype=torch.uint8)
    return codes, x.new_empty((n, g), dtype=torch.bfloat16), x.new_empty((n, g), dtype=torch.bfloat16)


def _fake_dequantize(codes, lo, scale, bits, group_size, shape, dtype):
    torch._check(dtype in PACKABLE_DTYPES, lambda: f"actbench::dequantize: dtype must be float32, float16 or bfloat16, got {dtype}")
    _check_fake_packed(codes, lo, scale, shape, group_size, "dequantize")
    return codes.new_empty(shape, dtype=dtype)


def _fake_dequantize_mixed(codes, lo, scale, bits, group_size, shape, dtype):
    torch._check(dtype in PACKABLE_DTYPES, lambda: f"actbench::dequantize_mixed: dtype must be float32, float16 or bfloat16, got {dtype}")
    _check_fake_packed(codes, lo, scale, shape, group_size, "dequantize_mixed")
    torch._check(bits.dtype == torch.int32 and bits.dim() == 1,
                 lambda: f"actbench::dequantize_mixed: bits must be int32 [N], got {bits.dtype} {tuple(bits.shape)}")
    return codes.new_empty(shape, dtype=dtype)


def _fake_pack_mask(mask):
    torch._check(mask.dtype == torch.bool or mask.dtype in PACKABLE_DTYPES,
                 lambda: f"actbench::pack_mask: mask must be bool, float32, float16 or bfloat16, got {mask.dtype}")
    return mask.new_empty(((mask.numel() + 7) // 8,), dtype=torch.uint8)


def _fake_unpack_mask(packed, shape):
    _check_fake_mask_bytes(packed, math.prod(shape), "unpack_mask")
    return packed.new_empty(shape, dtype=torch.bool)


def _fake_apply_mask(grad, packed, scale):
    torch._check(grad.dtype in PACKABLE_DTYPES, lambda: f"actbench::apply_mask: grad must be float32, float16 or bfloat16, got {grad.dtype}")
    _check_fake_mask_bytes(packed, grad.numel(), "apply_mask")
    return grad.new_empty(grad.shape)


def _fake_max_pool2d_with_argmax(x, kernel_size, stride, padding, dilation, ceil_mode):
    torch._check(x.dtype in PACKABLE_DTYPES and x.dim() in (3, 4),
                 lambda: f"actbench::max_pool2d_with_argmax: x must be float [C, H, W] or [N, C, H, W], got {x.dtype} {tuple(x.shape)}")
    torch._check(kernel_size[0] * kernel_size[1] <= 127,
                 lambda: f"actbench::max_pool2d_with_argmax: the window must hold at most 127 values, got {kernel_size}")
    oh, ow = pool_output_size(x.shape[-2:], kernel_size, stride, padding, dilation, ceil_mode)
    shape = (*x.shape[:-2], oh, ow)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int8)


def _fake_max_pool2d_backward(grad_out, argmax, input_shape, kernel_size, stride, padding, dilation):
    torch._check(argmax.dtype == torch.int8 and argmax.shape == grad_out.shape and len(input_shape) == grad_out.dim(),
                 lambda: f"actbench::max_pool2d_backward: argmax must be int8 with grad_out's shape {tuple(grad_out.shape)}, "
                         f"got {argmax.dtype} {tuple(argmax.shape)}")
    windows = [pool_output_size(input_shape[-2:], kernel_size, stride, padding, dilation, ceil) for ceil in (False, True)]
    torch._check(tuple(grad_out.shape[:-2]) == tuple(input_shape[:-2]) and tuple(grad_out.shape[-2:]) in windows,
                 lambda: f"actbench::max_pool2d_backward: grad_out {tuple(grad_out.shape)} is not a max pool output of "
                         f"input {tuple(input_shape)} (windows {windows[0]}, or {windows[1]} with ceil_mode)")
    return grad_out.new_empty(input_shape)


def _fake_allocate_bits(cost, weight, target, min_bits, max_bits):
    torch._check(cost.dtype == torch.float64 and weight.dtype == torch.float64 and cost.dim() == 1 and cost.shape == weight.shape,
                 lambda: f"actbench::allocate_bits: cost and weight must be float64 1-D tensors of one length, got "
                         f"{cost.dtype} {tuple(cost.shape)} and {weight.dtype} {tuple(weight.shape)}")
    return cost.new_empty(cost.shape, dtype=torch.int32)


#: Each op's fake (meta) kernel: shapes and dtypes, with the kernels' argument checks.
_FAKES = {
    "group_minmax": _fake_group_minmax,
    "quantize": _fake_quantize,
    "quantize_mixed": _fake_quantize_mixed,
    "dequantize": _fake_dequantize,
    "dequantize_mixed": _fake_dequantize_mixed,
    "pack_mask": _fake_pack_mask,
    "unpack_mask": _fake_unpack_mask,
    "apply_mask": _fake_apply_mask,
    "max_pool2d_with_argmax": _fake_max_pool2d_with_argmax,
    "max_pool2d_backward": _fake_max_pool2d_backward,
    "allocate_bits": _fake_allocate_bits,
}


def _register_fakes() -> None:
    for op, fake in _FAKES.items():
        torch.library.register_fake("actbench::" + op)(fake)


def pool_output_size(in_hw, kernel_size, stride, padding, dilation, ceil_mode) -> tuple[int, int]:
    """Output height and width of a 2-D max pool, PyTorch's formula (ceil_mode included)."""
    out = []
    for size, k, s, p, d in zip(in_hw, kernel_size, stride, padding, dilation):
        span = size + 2 * p - d * (k - 1) - 1
        o = (span + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (o - 1) * s >= size + p:
            o -= 1
        out.append(o)
    return out[0], out[1]


# ----------------------------------------------------------------------------------------------
# The packed activation.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackedTensor:
    """A quantized activation: packed codes plus per-group bf16 metadata.

    ``bits`` is an int (uniform) or a uint8 tensor [N] (per-sample mixed precision, kept on the
    same device as the codes). ``nbytes`` is the exact storage: codes + lo + scale (+ bits).
    """

    codes: torch.Tensor  # uint8 [total_bytes]
    lo: torch.Tensor  # bf16 [N, G]
    scale: torch.Tensor  # bf16 [N, G]
    bits: int | torch.Tensor
    group_size: int
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        extra = self.bits.numel() * self.bits.element_size() if isinstance(self.bits, torch.Tensor) else 0
        return _storage_bytes(self.codes) + _storage_bytes(self.lo) + _storage_bytes(self.scale) + extra

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors that hold the data (for save_for_backward or moving between devices)."""
        base = (self.codes, self.lo, self.scale)
        return base + (self.bits,) if isinstance(self.bits, torch.Tensor) else base


def _storage_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def packed_nbytes(shape: tuple[int, ...], bits: float, group_size: int = DEFAULT_GROUP_SIZE, mixed: bool = False) -> int:
    """Bytes a quantized tensor of ``shape`` takes at (average) ``bits`` per value, metadata included.

    With ``mixed`` (per-sample bits) the greedy allocator with unit weights lands exactly on
    max(N, floor(bits * N)) sample-bits (docs/design.md §2), so the size is known before the data;
    the per-sample bit widths add one byte per sample.
    """
    n = shape[0]
    g = -(-math.prod(shape[1:]) // group_size)
    total_bits = max(n, math.floor(bits * n)) if mixed else int(bits) * n
    return g * group_size * total_bits // 8 + 2 * 2 * n * g + (n if mixed else 0)


# ----------------------------------------------------------------------------------------------
# Public API.
# ----------------------------------------------------------------------------------------------


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"actbench.kernels.ops: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


#: Where seeds are drawn: a host generator, so drawing never waits for a device.
_HOST = torch.device("cpu")


def _draw_seed_offset(generator: torch.Generator | None) -> tuple[int, int]:
    """Seed and offset for the Philox stream, drawn from a CPU generator (no device sync)."""
    if generator is not None and generator.device != _HOST:
        raise ValueError(f"actbench.kernels.ops: generator must be a CPU torch.Generator, got one on {generator.device}")
    from actbench.core import compat

    # Real numbers even inside a FakeTensorMode (meta sizing): the draw is host bookkeeping.
    with compat.dispatch_modes_disabled():
        draw = torch.randint(0, 2**62, (2,), generator=generator, dtype=torch.int64)
        return int(draw[0]), int(draw[1])


def _check_input(x: torch.Tensor, group_size: int) -> None:
    if x.dtype not in PACKABLE_DTYPES:
        raise TypeError(f"actbench.quantize: x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() == 0 or x.numel() == 0:
        raise ValueError(f"actbench.quantize: x must be non-empty with a batch dimension, got shape {tuple(x.shape)}")
    if group_size <= 0 or group_size % 8:
        raise ValueError(f"actbench.quantize: group_size must be a positive multiple of 8, got {group_size}")


def _check_bits(bits: int | torch.Tensor, n: int) -> None:
    if isinstance(bits, torch.Tensor):
        if bits.shape != (n,) or bits.is_floating_point():
            raise ValueError(
                f"actbench.quantize: per-sample bits must be an integer tensor of shape ({n},), "
                f"got {bits.dtype} {tuple(bits.shape)}"
            )
        if bits.numel() and (int(bits.min()) < 1 or int(bits.max()) > 8):
            bad = bits[(bits < 1) | (bits > 8)][0].item()
            raise ValueError(f"actbench.quantize: per-sample bits must be in 1..8, got {bad}")
    elif isinstance(bits, bool) or not isinstance(bits, int) or bits not in (1, 2, 4, 8):
        raise ValueError(f"actbench.quantize: bits must be 1, 2, 4 or 8 (or a per-sample tensor of 1..8), got {bits!r}")


def group_minmax(
    x: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE, *, backend: Backend = "extension"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group min and max of each sample: float32 [N, G]; NaN where a group holds NaN/inf."""
    _check_backend(backend)
    _check_input(x, group_size)
    if backend == "oracle":
        mn, mx = oracle.group_minmax(x.cpu(), group_size)
        return mn.to(x.device), mx.to(x.device)
    return _lib().group_minmax.default(x, group_size)


def quantize(
    x: torch.Tensor,
    bits: int | torch.Tensor,
    *,
    group_size: int = DEFAULT_GROUP_SIZE,
    generator: torch.Generator | None = None,
    backend: Backend = "extension",
    seed_offset: tuple[int, int] | None = None,
    total_bits: int | None = None,
    minmax: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PackedTensor:
    """Stochastically quantize x [N, ...] to ``bits`` per value (int, or per-sample tensor [N]).

    ``seed_offset`` pins the Philox stream (tests, reproducibility); otherwise it is drawn from
    ``generator`` (a CPU generator; torch's default when None). With per-sample bits on a GPU,
    pass ``total_bits`` = sum(bits) known on the host to avoid reading the bits back (a sync);
    the values are then trusted (the kernel still never writes out of bounds). ``minmax`` reuses
    a :func:`group_minmax` result computed earlier (e.g. for the bit allocation).
    """
    _check_backend(backend)
    _check_input(x, group_size)
    if total_bits is None or not isinstance(bits, torch.Tensor):
        _check_bits(bits, x.shape[0])
    elif not (x.shape[0] <= total_bits <= 8 * x.shape[0]):
        raise ValueError(f"actbench.quantize: total_bits must be in [{x.shape[0]}, {8 * x.shape[0]}], got {total_bits}")
    seed, offset = seed_offset if seed_offset is not None else _draw_seed_offset(generator)
    if minmax is not None:
        mn, mx = minmax
    elif backend == "oracle":
        mn, mx = group_minmax(x, group_size, backend=backend)
    else:  # empty: the kernel takes each group's range in its quantizing pass
        mn = mx = x.new_empty((0,), dtype=torch.float32)
    if backend == "oracle":
        bits_t = bits.cpu() if isinstance(bits, torch.Tensor) else torch.full((x.shape[0],), bits)
        codes, lo, scale = oracle.quantize(x, mn, mx, bits_t, group_size, seed, offset)
        codes, lo, scale = codes.to(x.device), lo.to(x.device), scale.to(x.device)
    elif isinstance(bits, torch.Tensor):
        # Summing on the host is free when the allocator produced the bits there (the usual case).
        total = total_bits if total_bits is not None else int(bits.sum())
        bits = bits.to(device=x.device, dtype=torch.int32, non_blocking=True)
        codes, lo, scale = _lib().quantize_mixed.default(x, mn, mx, bits, total, group_size, seed, offset)
    else:
        codes, lo, scale = _lib().quantize.default(x, mn, mx, bits, group_size, seed, offset)
    if isinstance(bits, torch.Tensor):
        bits = bits.to(device=x.device, dtype=torch.uint8)
    return PackedTensor(codes, lo, scale, bits, group_size, x.shape, x.dtype)


def dequantize(packed: PackedTensor, *, backend: Backend = "extension") -> torch.Tensor:
    """Unpack and dequantize back to the original shape and dtype."""
    _check_backend(backend)
    p = packed
    if backend == "oracle":
        bits = p.bits if isinstance(p.bits, torch.Tensor) else torch.full((p.shape[0],), p.bits)
        return oracle.dequantize(p.codes, p.lo, p.scale, bits, p.group_size, tuple(p.shape), p.dtype)
    if isinstance(p.bits, torch.Tensor):
        bits = p.bits.to(torch.int32)
        return _lib().dequantize_mixed.default(p.codes, p.lo, p.scale, bits, p.group_size, list(p.shape), p.dtype)
    return _lib().dequantize.default(p.codes, p.lo, p.scale, p.bits, p.group_size, list(p.shape), p.dtype)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """bool tensor (or a float tensor, read as value > 0: a ReLU's output) -> uint8 [ceil(numel / 8)],
    8 values a byte, least significant bit first."""
    if mask.dtype != torch.bool and mask.dtype not in PACKABLE_DTYPES:
        raise TypeError(f"actbench.pack_mask: mask must be bool, float32, float16 or bfloat16, got {mask.dtype}")
    return _lib().pack_mask.default(mask)


def unpack_mask(packed: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`pack_mask` -> bool tensor of ``shape``."""
    return _lib().unpack_mask.default(packed, list(shape))


def apply_mask(grad: torch.Tensor, packed: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """grad * scale where the :func:`pack_mask` bits are set, else 0 (threshold_backward's select), in one pass."""
    return _lib().apply_mask.default(grad, packed, float(scale))


def max_pool2d_with_argmax(
    x: torch.Tensor,
    kernel_size: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    ceil_mode: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """2-D max pool of x [N, C, H, W] (or [C, H, W]) -> (output, int8 argmax inside each window)."""
    return _lib().max_pool2d_with_argmax.default(
        x, list(kernel_size), list(stride), list(padding), list(dilation), ceil_mode
    )


def max_pool2d_backward(
    grad_out: torch.Tensor,
    argmax: torch.Tensor,
    input_shape: torch.Size | tuple[int, ...],
    kernel_size: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
) -> torch.Tensor:
    """Gradient of the input of :func:`max_pool2d_with_argmax` (deterministic, no atomics)."""
    return _lib().max_pool2d_backward.default(
        grad_out, argmax, list(input_shape), list(kernel_size), list(stride), list(padding), list(dilation)
    )


def allocate_bits(
    cost: torch.Tensor, weight: torch.Tensor, target: float, min_bits: int = 1, max_bits: int = 8
) -> torch.Tensor:
    """Greedy bit allocation (docs/design.md §2): minimise sum C_i / (2^b_i - 1)^2 s.t. sum w_i b_i <= target.

    ``cost`` and ``weight`` are float64 [K] on the CPU; returns int32 [K] in min_bits..max_bits.
    """
    cost = cost.detach().to(device="cpu", dtype=torch.float64).contiguous()
    weight = weight.detach().to(device="cpu", dtype=torch.float64).contiguous()
    return _lib().allocate_bits.default(cost, weight, float(target), min_bits, max_bits)
