"""Pure-PyTorch oracle of actbench's quantizer: the test oracle, and a backend on request.

It implements exactly the layout and arithmetic of the compiled kernels (csrc/include/actbench/
quant_math.h), so for the same (seed, offset) both produce the same codes and metadata bit for bit.
Groups, metadata, stochastic rounding, random numbers and packing: docs/design.md §2.
"""

from __future__ import annotations

import torch

EPS = 1e-8
_M32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_BF16_NAN_BITS = 0x7FC0


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of a * b, for a < 2^32 and int64 b < 2^32, without overflow."""
    t_lo = a * (b & 0xFFFF)
    t_hi = a * (b >> 16)
    s = t_lo + ((t_hi & 0xFFFF) << 16)
    return (t_hi >> 16) + (s >> 32), s & _M32


def philox4x32_10(counter: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding 32-bit words; returns the four output words."""
    c0, c1, c2, c3 = counter
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi0, lo0 = _mulhilo(_PHILOX_M[0], c0)
        hi1, lo1 = _mulhilo(_PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _PHILOX_W[0]) & _M32, (k1 + _PHILOX_W[1]) & _M32
    return [c0, c1, c2, c3]


def chunk_uniforms(chunk: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    """Uniforms in [0, 1) for chunk indices ``chunk`` (int64 [C]) -> float32 [C, 8]."""
    off_lo = torch.full_like(chunk, offset & _M32)
    off_hi = torch.full_like(chunk, (offset >> 32) & _M32)
    words = philox4x32_10([chunk & _M32, (chunk >> 32) & _M32, off_lo, off_hi], seed)
    halves = []
    for w in words:
        halves += [w & 0xFFFF, (w >> 16) & 0xFFFF]
    return torch.stack(halves, dim=1).to(torch.float32) * (1.0 / 65536.0)


def _bf16_bits_to_float(bits: torch.Tensor) -> torch.Tensor:
    return (bits.to(torch.int64) << 16).to(torch.int32).view(torch.float32)


def _round_to_bf16_bits(v: torch.Tensor, towards_neg_inf: bool) -> torch.Tensor:
    """float32 -> bf16 bit pattern (int64), rounded towards -inf or towards zero; NaN stays NaN."""
    bits = v.contiguous().view(torch.int32).to(torch.int64) & _M32
    negative = (bits >> 31) == 1
    if towards_neg_inf:  # negative values round away from zero in magnitude
        bits = torch.where(negative, bits + 0xFFFF, bits)
    out = (bits >> 16) & 0xFFFF
    return torch.where(torch.isnan(v), torch.full_like(out, _BF16_NAN_BITS), out)


def bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (int64) -> a torch.bfloat16 tensor."""
    return bits.to(torch.int32).to(torch.int16).view(torch.bfloat16)


def _as_samples(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """x -> (values float32 [N, G, S] zero-padded, valid mask [G*S], G)."""
    n = x.shape[0]
    flat = x.reshape(n, -1).to(torch.float32)
    f = flat.shape[1]
    g = -(-f // group_size)
    pad = g * group_size - f
    values = torch.nn.functional.pad(flat, (0, pad)).reshape(n, g, group_size)
    valid = torch.arange(g * group_size) < f
    return values, valid, g


def group_minmax(x: torch.Tensor, group_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group min and max, float32 [N, G]; NaN for a group holding NaN or +-inf."""
    values, valid, g = _as_samples(x, group_size)
    valid = valid.reshape(g, group_size)
    mn = torch.where(valid, values, torch.inf).amin(dim=2)
    mx = torch.where(valid, values, -torch.inf).amax(dim=2)
    bad = (~torch.isfinite(torch.where(valid, values, 0.0))).any(dim=2)
    nan = torch.full_like(mn, float("nan"))
    return torch.where(bad, nan, mn), torch.where(bad, nan, mx)


def quant_params(mn: torch.Tensor, mx: torch.Tensor, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, scale) as bf16 bit patterns (int64 [N, G]) for per-sample bit widths ``bits`` [N]."""
    levels = ((1 << bits.to(torch.int64)) - 1).to(torch.float32)[:, None]
    lo_bits = _round_to_bf16_bits(mn, towards_neg_inf=True)
    lo = _bf16_bits_to_float(lo_bits)
    span = mx - lo
    scale = levels / (span + EPS)
    bad = ~torch.isfinite(span)
    scale_bits = _round_to_bf16_bits(torch.where(bad, float("nan"), scale), towards_neg_inf=False)
    lo_bits = torch.where(bad, torch.full_like(lo_bits, _BF16_NAN_BITS), lo_bits)
    return lo_bits, scale_bits


def _sample_byte_offsets(bits: torch.Tensor, bytes_per_bit: int) -> torch.Tensor:
    starts = torch.cumsum(bits.to(torch.int64), 0) - bits.to(torch.int64)
    return starts * bytes_per_bit


def pack_codes(codes: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Codes (int64 [N, P], P a multiple of 8) -> packed uint8 [sum_n P * b_n / 8]."""
    out = []
    for q, b in zip(codes, bits.tolist()):
        chunks = q.reshape(-1, 8)
        bit_planes = (chunks[:, :, None] >> torch.arange(b)) & 1  # [C, 8 codes, b bits]
        stream = bit_planes.reshape(-1, b * 8 // 8, 8)  # LSB-first bit stream -> bytes
        out.append((stream << torch.arange(8)).sum(dim=2).reshape(-1))
    return torch.cat(out).to(torch.uint8) if out else torch.empty(0, dtype=torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: torch.Tensor, codes_per_sample: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes` -> int64 [N, P]."""
    starts = _sample_byte_offsets(bits, codes_per_sample // 8).tolist()
    rows = []
    for start, b in zip(starts, bits.tolist()):
        nbytes = codes_per_sample * b // 8
        raw = packed[start : start + nbytes].to(torch.int64).reshape(-1, b, 1)
        stream = ((raw >> torch.arange(8)) & 1).reshape(-1, 8, b)  # [C, 8 codes, b bits]
        rows.append((stream << torch.arange(b)).sum(dim=2).reshape(-1))
    return torch.stack(rows)


def quantize(
    x: torch.Tensor, mn: torch.Tensor, mx: torch.Tensor, bits: torch.Tensor, group_size: int, seed: int, offset: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stochastically quantize and pack x -> (codes uint8 [bytes], lo bf16 [N, G], scale bf16 [N, G])."""
    x = x.cpu()
    values, valid, g = _as_samples(x, group_size)
    n = values.shape[0]
    lo_bits, scale_bits = quant_params(mn.cpu(), mx.cpu(), bits.cpu())
    lo = _bf16_bits_to_float(lo_bits)[:, :, None]
    scale = _bf16_bits_to_float(scale_bits)[:, :, None]
    chunks_per_sample = g * group_size // 8
    chunk = torch.arange(n * chunks_per_sample, dtype=torch.int64)
    u = chunk_uniforms(chunk, seed, offset).reshape(n, g, group_size)
    levels = ((1 << bits.cpu().to(torch.int64)) - 1)[:, None, None]
    v = torch.floor((values - lo) * scale + u)
    good = torch.isfinite(v) & valid.reshape(1, g, group_size)
    q = torch.where(good, v, 0.0).to(torch.int64)
    q = torch.minimum(torch.clamp(q, min=0), levels)
    codes = pack_codes(q.reshape(n, -1), bits.cpu())
    return codes, bits_to_bf16(lo_bits), bits_to_bf16(scale_bits)


def dequantize(
    codes: torch.Tensor,
    lo: torch.Tensor,
    scale: torch.Tensor,
    bits: torch.Tensor,
    group_size: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """Unpack and dequantize -> tensor of ``shape`` and ``dtype`` (on the device of ``codes``)."""
    device = codes.device
    n, g = lo.shape
    q = unpack_codes(codes.cpu(), bits.cpu(), g * group_size).reshape(n, g, group_size)
    lo_f = lo.cpu().to(torch.float32)[:, :, None]
    scale_f = scale.cpu().to(torch.float32)[:, :, None]
    x_hat = q.to(torch.float32) / scale_f + lo_f
    numel_per_sample = 1
    for d in shape[1:]:
        numel_per_sample *= d
    x_hat = x_hat.reshape(n, -1)[:, :numel_per_sample]
    return x_hat.reshape(shape).to(dtype).to(device)
