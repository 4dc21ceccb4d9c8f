// Per-element math of actbench's quantizer, written once and compiled for both the CPU loops
// (g++) and the CUDA kernels (nvcc), so a CPU test exercises the very code the GPU runs and a
// GPU test can demand bit-identical codes. No torch headers here: nvcc compiles this fast.
//
// Layout and arithmetic are specified in actbench/reference.py (the pure-PyTorch oracle).
// Floating-point contraction is disabled on both compilers (-ffp-contract=off, --fmad=false)
// so every multiply and add rounds exactly as the reference's separate torch ops do.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define ACTBENCH_HD __host__ __device__ __forceinline__
#else
#define ACTBENCH_HD inline
#endif

namespace actbench {

constexpr float kEps = 1e-8f;
constexpr uint16_t kBf16NaN = 0x7FC0;

// ---------------------------------------------------------------------------------------------
// Bit casts and 16-bit float formats (round-to-nearest-even, as torch's .to(dtype)).
// ---------------------------------------------------------------------------------------------

ACTBENCH_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

ACTBENCH_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

ACTBENCH_HD bool is_finite(float f) { return (float_bits(f) & 0x7F800000u) != 0x7F800000u; }
ACTBENCH_HD bool is_nan(float f) { return (float_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

ACTBENCH_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

ACTBENCH_HD uint16_t float_to_bf16_rne(float f) {
  uint32_t u = float_bits(f);
  if (is_nan(f)) return kBf16NaN;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Directed roundings for the metadata: lo rounds towards -inf (lo <= every value of the group),
// scale towards zero ((x - lo) * scale never exceeds 2^b - 1), so stochastic rounding never clamps.
ACTBENCH_HD uint16_t float_to_bf16_down(float f) {
  if (is_nan(f)) return kBf16NaN;
  uint32_t u = float_bits(f);
  if (u >> 31) u += 0xFFFFu;
  return static_cast<uint16_t>(u >> 16);
}

ACTBENCH_HD uint16_t float_to_bf16_towards_zero(float f) {
  if (is_nan(f)) return kBf16NaN;
  return static_cast<uint16_t>(float_bits(f) >> 16);
}

ACTBENCH_HD float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // Subnormal: value = man * 2^-24, exact in float.
    float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

ACTBENCH_HD uint16_t float_to_half_rne(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (a < 0x38800000u) {  // result is subnormal (or zero): round a * 2^24 to an integer, RNE
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e;  // value = m * 2^(e-150); want m * 2^(e-150+24) = m >> (126 - e)
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15, round mantissa
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Storage formats, addressed by a small integer so the CUDA launchers need no torch headers.
enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

template <int D>
struct Format;
template <>
struct Format<kF32> {
  using T = float;
  static ACTBENCH_HD float load(T v) { return v; }
  static ACTBENCH_HD T store(float f) { return f; }
};
template <>
struct Format<kF16> {
  using T = uint16_t;
  static ACTBENCH_HD float load(T v) { return half_to_float(v); }
  static ACTBENCH_HD T store(float f) { return float_to_half_rne(f); }
};
template <>
struct Format<kBF16> {
  using T = uint16_t;
  static ACTBENCH_HD float load(T v) { return bf16_to_float(v); }
  static ACTBENCH_HD T store(float f) { return float_to_bf16_rne(f); }
};

// ---------------------------------------------------------------------------------------------
// Philox4x32-10: counter = (chunk index, offset), key = seed. One call serves one chunk of 8.
// ---------------------------------------------------------------------------------------------

struct Uint4 {
  uint32_t w[4];
};

ACTBENCH_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

ACTBENCH_HD Uint4 philox4x32_10(uint64_t chunk, uint64_t seed, uint64_t offset) {
  uint32_t c0 = static_cast<uint32_t>(chunk), c1 = static_cast<uint32_t>(chunk >> 32);
  uint32_t c2 = static_cast<uint32_t>(offset), c3 = static_cast<uint32_t>(offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
    mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  Uint4 out = {{c0, c1, c2, c3}};
  return out;
}

// Uniform in [0, 1) for value j (0..7) of a chunk: 16-bit halves of the four Philox words.
ACTBENCH_HD float chunk_uniform(const Uint4& r, int j) {
  uint32_t half = (r.w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu;
  return static_cast<float>(half) * (1.0f / 65536.0f);
}

// ---------------------------------------------------------------------------------------------
// Group metadata and codes.
// ---------------------------------------------------------------------------------------------

struct GroupParams {
  uint16_t lo_bits;     // bf16
  uint16_t scale_bits;  // bf16
  float lo;             // the same values as float, for the arithmetic
  float scale;
  bool finite;
};

// mn/mx are the group's float32 min and max (NaN when the group holds a non-finite value).
ACTBENCH_HD GroupParams group_params(float mn, float mx, int bits) {
  GroupParams p;
  p.lo_bits = float_to_bf16_down(mn);
  p.lo = bf16_to_float(p.lo_bits);
  float span = mx - p.lo;
  p.finite = is_finite(span);
  if (!p.finite) {
    p.lo_bits = kBf16NaN;
    p.scale_bits = kBf16NaN;
  } else {
    float levels = static_cast<float>((1 << bits) - 1);
    p.scale_bits = float_to_bf16_towards_zero(levels / (span + kEps));
  }
  p.lo = bf16_to_float(p.lo_bits);
  p.scale = bf16_to_float(p.scale_bits);
  return p;
}

// Stochastic code of value x in its group: floor((x - lo) * scale + u), clamped to [0, 2^b - 1].
ACTBENCH_HD uint32_t stochastic_code(float x, const GroupParams& p, float u, int bits) {
  // Branch-free so the CPU loop vectorizes: NaN and negatives -> 0 (a comparison with NaN is
  // false), values at or above the top level -> the top level, the rest truncated (== floor).
  float top = static_cast<float>((1 << bits) - 1);
  float v = (x - p.lo) * p.scale + u;
  v = v >= 0.0f ? v : 0.0f;
  v = v < top ? v : top;
  return p.finite ? static_cast<uint32_t>(static_cast<int32_t>(v)) : 0u;
}

ACTBENCH_HD float dequantize_code(uint32_t q, float lo, float scale) { return static_cast<float>(q) / scale + lo; }

// Pack 8 codes of b bits into b bytes, least significant bit first.
ACTBENCH_HD void pack8(const uint32_t q[8], int bits, uint8_t* out) {
  uint64_t word = 0;
  for (int j = 0; j < 8; ++j) word |= static_cast<uint64_t>(q[j]) << (j * bits);
  for (int k = 0; k < bits; ++k) out[k] = static_cast<uint8_t>(word >> (8 * k));
}

// Code j (0..7) of a chunk packed by pack8: bits [j*b, j*b + b) of its b bytes, which span at most
// two bytes. Reads only the chunk's own bytes, so one thread can decode one value.
ACTBENCH_HD uint32_t code_of(const uint8_t* in, int bits, int j) {
  const int first = j * bits, byte = first >> 3, shift = first & 7;
  uint32_t v = in[byte];
  if (shift + bits > 8) v |= static_cast<uint32_t>(in[byte + 1]) << 8;
  return (v >> shift) & ((1u << bits) - 1u);
}

ACTBENCH_HD void unpack8(const uint8_t* in, int bits, uint32_t q[8]) {
  for (int j = 0; j < 8; ++j) q[j] = code_of(in, bits, j);
}

// ---------------------------------------------------------------------------------------------
// Layout: how x [N, ...] splits into groups and 8-value chunks, and where each sample's codes go.
// ---------------------------------------------------------------------------------------------

struct Groups {
  int64_t n, per_sample, group_size, g;  // per_sample = F values, g = ceil(F / group_size)
  ACTBENCH_HD int64_t padded() const { return g * group_size; }
  ACTBENCH_HD int64_t chunks_per_sample() const { return padded() / 8; }
};

// Uniform bits (bits == nullptr) or per-sample bits with precomputed byte offsets. A chunk of 8
// codes at b bits takes b bytes, so sample n starts at chunks_per_sample * sum_{m<n} b_m.
struct SampleLayout {
  int uniform_bits;
  const int32_t* bits;         // [N] or nullptr
  const int64_t* byte_starts;  // [N] or nullptr
  ACTBENCH_HD int bits_of(int64_t n) const { return bits ? bits[n] : uniform_bits; }
  ACTBENCH_HD int64_t start_of(int64_t n, int64_t chunks_per_sample) const {
    return byte_starts ? byte_starts[n] : n * chunks_per_sample * uniform_bits;
  }
};

// A chunk: 8 consecutive values of a sample (chunk k), quantized and packed into `bits` bytes.
// Positions past the sample's end (padding of the last group) get code 0.

// The 8 values of chunk k as float (0 past the sample's end); returns how many are inside it.
template <int D>
ACTBENCH_HD int load_chunk(const typename Format<D>::T* sample, int64_t per_sample, int64_t k, float v[8]) {
  const int64_t base = k * 8;
  const int valid = per_sample - base >= 8 ? 8 : static_cast<int>(per_sample - base);
  for (int j = 0; j < 8; ++j) v[j] = j < valid ? Format<D>::load(sample[base + j]) : 0.0f;
  return valid;
}

// Codes of a chunk's values v (the first `valid` of them; the rest are padding, code 0), packed.
ACTBENCH_HD void quantize8(const float v[8], int valid, const GroupParams& p, int bits, uint64_t global_chunk,
                           uint64_t seed, uint64_t offset, uint8_t* out) {
  Uint4 r = philox4x32_10(global_chunk, seed, offset);
  uint32_t q[8];
  for (int j = 0; j < 8; ++j) q[j] = j < valid ? stochastic_code(v[j], p, chunk_uniform(r, j), bits) : 0u;
  pack8(q, bits, out);
}

// ---------------------------------------------------------------------------------------------
// 1-bit masks: a ReLU's mask is read from its float output (y > 0 exactly where x > 0; NaN -> 0),
// and backward applies it to the gradient in one pass: bit ? grad * scale : 0 (threshold_backward's
// select, so a NaN gradient where the mask is clear gives 0, not NaN).
// ---------------------------------------------------------------------------------------------

ACTBENCH_HD uint32_t mask_bit(float v) { return v > 0.0f ? 1u : 0u; }

ACTBENCH_HD float masked_value(float g, uint32_t bit, float scale) { return bit ? g * scale : 0.0f; }

// ---------------------------------------------------------------------------------------------
// Max pooling: the window position of an output and the int8 argmax encoding.
// ---------------------------------------------------------------------------------------------

struct Pool2d {
  int64_t in_h, in_w, out_h, out_w;
  int kh, kw, sh, sw, ph, pw, dh, dw;
};

// Max over one window; NaN propagates as in PyTorch. Returns the window index kh_i * kw + kw_i.
template <typename Load, typename T>
ACTBENCH_HD int8_t window_argmax(const T* plane, const Pool2d& p, int64_t oh, int64_t ow, float* best_out) {
  float best = bits_float(0xFF800000u);  // -inf
  int8_t arg = -1;
  int64_t h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
  for (int i = 0; i < p.kh; ++i) {
    int64_t h = h0 + static_cast<int64_t>(i) * p.dh;
    if (h < 0 || h >= p.in_h) continue;
    for (int j = 0; j < p.kw; ++j) {
      int64_t w = w0 + static_cast<int64_t>(j) * p.dw;
      if (w < 0 || w >= p.in_w) continue;
      float v = Load::load(plane[h * p.in_w + w]);
      if (arg < 0 || v > best || is_nan(v)) {
        best = v;
        arg = static_cast<int8_t>(i * p.kw + j);  // after a NaN only a later NaN wins: PyTorch's rule
      }
    }
  }
  *best_out = best;
  return arg;
}

// Whether output (oh, ow)'s whole window lies inside the input (no bounds checks needed).
ACTBENCH_HD bool window_inside(const Pool2d& p, int64_t oh, int64_t ow) {
  int64_t h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
  return h0 >= 0 && w0 >= 0 && h0 + static_cast<int64_t>(p.kh - 1) * p.dh < p.in_h &&
         w0 + static_cast<int64_t>(p.kw - 1) * p.dw < p.in_w;
}

// window_argmax for a window inside the input: the same order and rule, without bounds checks.
template <typename Load, typename T>
ACTBENCH_HD int8_t window_argmax_inside(const T* plane, const Pool2d& p, int64_t oh, int64_t ow, float* best_out) {
  const T* w0 = plane + (oh * p.sh - p.ph) * p.in_w + (ow * p.sw - p.pw);
  float best = Load::load(w0[0]);
  int8_t arg = 0;
  for (int i = 0; i < p.kh; ++i) {
    const T* row = w0 + static_cast<int64_t>(i) * p.dh * p.in_w;
    for (int j = (i == 0 ? 1 : 0); j < p.kw; ++j) {
      float v = Load::load(row[static_cast<int64_t>(j) * p.dw]);
      if (v > best || is_nan(v)) {
        best = v;
        arg = static_cast<int8_t>(i * p.kw + j);
      }
    }
  }
  *best_out = best;
  return arg;
}

// Gradient of input (h, w): the sum of grad_out over the windows whose argmax points at it.
// A gather (not a scatter), so it is deterministic and needs no atomics on the GPU. Window
// positions are visited with i, then j, ascending (output rows, then columns, descending): the
// CPU's scatter adds in this order too, so both agree bit for bit.
// I: the index type, int32_t where a plane's sizes fit (GPU integer division is far cheaper at 32
// bits), else int64_t; the sum and its order do not depend on it.
template <typename Load, typename T, typename I = int64_t>
ACTBENCH_HD float pool_input_grad_dilated(const T* grad_plane, const int8_t* arg_plane, const Pool2d& p, I h, I w) {
  float acc = 0.0f;
  const I sh = p.sh, sw = p.sw, out_h = static_cast<I>(p.out_h), out_w = static_cast<I>(p.out_w);
  for (int i = 0; i < p.kh; ++i) {
    const I hh = h + p.ph - static_cast<I>(i) * p.dh;
    if (hh < 0) break;  // hh only falls as i grows
    const I oh = hh / sh;
    if (oh * sh != hh || oh >= out_h) continue;
    for (int j = 0; j < p.kw; ++j) {
      const I ww = w + p.pw - static_cast<I>(j) * p.dw;
      if (ww < 0) break;
      const I ow = ww / sw;
      if (ow * sw != ww || ow >= out_w) continue;
      if (arg_plane[oh * out_w + ow] == i * p.kw + j) acc += Load::load(grad_plane[oh * out_w + ow]);
    }
  }
  return acc;
}

// The first index q >= 0 with q * s >= a (a may be negative), for s > 0.
template <typename I>
ACTBENCH_HD I first_multiple_at_least(I a, I s) {
  return a <= 0 ? I(0) : (a + s - 1) / s;
}

// pool_input_grad_dilated's sum in its order. Without dilation the outputs whose window holds
// (h, w) form one range per axis, found with two divisions each, where the loop above divides at
// every window position (on the GPU that division, not memory, bounded the kernel).
template <typename Load, typename T, typename I = int64_t>
ACTBENCH_HD float pool_input_grad(const T* grad_plane, const int8_t* arg_plane, const Pool2d& p, I h, I w) {
  if (p.dh != 1 || p.dw != 1) return pool_input_grad_dilated<Load, T, I>(grad_plane, arg_plane, p, h, w);
  const I sh = p.sh, sw = p.sw, out_w = static_cast<I>(p.out_w);
  const I top = h + p.ph, left = w + p.pw;  // window row i of output oh holds h when oh * sh + i == top
  const I last_h = static_cast<I>(p.out_h) - 1, last_w = out_w - 1;
  const I oh_hi = top / sh < last_h ? top / sh : last_h, ow_hi = left / sw < last_w ? left / sw : last_w;
  const I oh_lo = first_multiple_at_least<I>(top - (p.kh - 1), sh);
  const I ow_lo = first_multiple_at_least<I>(left - (p.kw - 1), sw);
  float acc = 0.0f;
  for (I oh = oh_hi; oh >= oh_lo; --oh) {
    const int i = static_cast<int>(top - oh * sh);
    for (I ow = ow_hi; ow >= ow_lo; --ow) {
      const I o = oh * out_w + ow;
      if (arg_plane[o] == i * p.kw + static_cast<int>(left - ow * sw)) acc += Load::load(grad_plane[o]);
    }
  }
  return acc;
}

}  // namespace actbench
