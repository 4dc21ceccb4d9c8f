// CPU kernels of every actbench op. Per-element math comes from quant_math.h (shared with CUDA);
// the loops here are parallel over groups (at::parallel_for) with simple inner loops that the
// compiler vectorizes.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "actbench/checks.h"
#include "actbench/quant_math.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
// AVX2 blocks (ACTBENCH_X86_AVX2 on x86 with GCC/Clang), compiled for AVX2 and chosen at run time
#include "avx2_blocks.h"

namespace actbench {
namespace {

constexpr int64_t kGroupGrain = 16;  // groups per parallel task: ~16 KiB of fp32 input

// kLocalCopies: with OpenMP, at::parallel_for's body becomes a separate function that reaches the
// caller's variables through memory, and a store through a byte pointer (uint8_t, bool, int8_t)
// may alias any of them, so the compiler reloads them on every iteration and does not vectorize.
// Loops that store bytes therefore copy the pointers they use into locals of the body first.

// An op's output, its pages mapped before the op writes it. A large tensor is often fresh memory
// (its own mmap), and a fault per 4 KiB page cost more than the arithmetic of the ops that write
// one: 256 MiB is 65,536 faults, about 75 of max_pool2d_backward's 100 ms here (docs/design.md §2,
// "Fresh outputs"). MADV_POPULATE_WRITE (Linux 5.14) maps a range in one call without writing it;
// two threads each mapping half took as long as torch's own fill of fresh memory (76 ms), where the
// extension's loops, faulting page by page, took 87-93 ms.
// Walking pages that are already mapped costs about 30 us a MiB, nearly a fill, so a block the
// heap hands back mapped (its first, middle and last pages resident) is left alone. Where a call
// is refused (an older kernel) the op faults as before.
constexpr int64_t kPopulateMinBytes = int64_t{1} << 20;  // below: three residency checks cost more
constexpr int64_t kPopulatePagesPerTask = 1024;          // 4 MiB a call with 4 KiB pages
constexpr int kMadvPopulateWrite = 23;                   // MADV_POPULATE_WRITE, for older headers

#if defined(__linux__)
bool page_resident(uintptr_t page, uintptr_t page_size) {
  unsigned char v = 0;
  return mincore(reinterpret_cast<void*>(page), page_size, &v) == 0 && (v & 1) != 0;
}
#endif

at::Tensor empty_output(c10::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor out = at::empty(shape, options);
#if defined(__linux__)
  const int64_t bytes = out.numel() * static_cast<int64_t>(out.element_size());
  if (bytes >= kPopulateMinBytes) {
    static const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t start = reinterpret_cast<uintptr_t>(out.data_ptr());
    const uintptr_t first = (start + kPage - 1) & ~(kPage - 1), last = (start + bytes) & ~(kPage - 1);
    const int64_t pages = last > first ? static_cast<int64_t>((last - first) / kPage) : 0;
    const bool mapped = pages > 0 && page_resident(first, kPage) && page_resident(first + pages / 2 * kPage, kPage) &&
                        page_resident(last - kPage, kPage);
    if (!mapped) {
      at::parallel_for(0, pages, kPopulatePagesPerTask, [&](int64_t begin, int64_t end) {
        (void)madvise(reinterpret_cast<void*>(first + begin * kPage), (end - begin) * kPage, kMadvPopulateWrite);
      });
    }
  }
#endif
  return out;
}

// Whether this CPU runs the AVX2 functions (asked once).
inline bool has_avx2() {
#if defined(ACTBENCH_X86_AVX2)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

// Min and max of one group of len values (NaN for both when it holds NaN or +-inf). Eight
// independent lanes so the loop vectorizes; v * 0 is NaN exactly for NaN and +-inf.
template <int D>
inline void group_range(const typename Format<D>::T* p, int64_t len, float* mn_out, float* mx_out) {
  float lmn[8], lmx[8], lbad[8];
  for (int j = 0; j < 8; ++j) {
    lmn[j] = bits_float(0x7F800000u);
    lmx[j] = bits_float(0xFF800000u);
    lbad[j] = 0.0f;
  }
  const int64_t full = len / 8 * 8;
  int64_t done = 0;
#if defined(ACTBENCH_X86_AVX2)
  if constexpr (D == kF32) {
    if (has_avx2()) {
      avx2::range_f32(p, full, lmn, lmx, lbad);
      done = full;
    }
  }
#endif
  for (int64_t i = done; i < full; i += 8) {
    for (int j = 0; j < 8; ++j) {
      float v = Format<D>::load(p[i + j]);
      lmn[j] = v < lmn[j] ? v : lmn[j];
      lmx[j] = v > lmx[j] ? v : lmx[j];
      lbad[j] += v * 0.0f;
    }
  }
  for (int64_t i = full; i < len; ++i) {
    float v = Format<D>::load(p[i]);
    lmn[0] = v < lmn[0] ? v : lmn[0];
    lmx[0] = v > lmx[0] ? v : lmx[0];
    lbad[0] += v * 0.0f;
  }
  float a = lmn[0], b = lmx[0];
  bool bad = false;
  for (int j = 0; j < 8; ++j) {
    a = lmn[j] < a ? lmn[j] : a;
    b = lmx[j] > b ? lmx[j] : b;
    bad = bad || is_nan(lbad[j]);
  }
  *mn_out = bad ? bits_float(0x7FC00000u) : a;
  *mx_out = bad ? bits_float(0x7FC00000u) : b;
}

template <int D>
void minmax_groups(const at::Tensor& x, const Groups& gr, float* mn, float* mx) {
  using T = typename Format<D>::T;
  const T* data = reinterpret_cast<const T*>(x.data_ptr());
  at::parallel_for(0, gr.n * gr.g, kGroupGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t n = t / gr.g, first = (t % gr.g) * gr.group_size;
      group_range<D>(data + n * gr.per_sample + first, std::min(gr.group_size, gr.per_sample - first), mn + t, mx + t);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> group_minmax_cpu(const at::Tensor& x_in, int64_t group_size) {
  Groups gr = groups_of(x_in.sizes(), group_size, "group_minmax");
  int code = dtype_code(x_in.scalar_type(), "group_minmax", "x");
  at::Tensor x = x_in.contiguous();
  auto opts = x.options().dtype(at::kFloat);
  at::Tensor mn = at::empty({gr.n, gr.g}, opts), mx = at::empty({gr.n, gr.g}, opts);
  float *pmn = mn.data_ptr<float>(), *pmx = mx.data_ptr<float>();
  switch (code) {
    case kF32: minmax_groups<kF32>(x, gr, pmn, pmx); break;
    case kF16: minmax_groups<kF16>(x, gr, pmn, pmx); break;
    case kBF16: minmax_groups<kBF16>(x, gr, pmn, pmx); break;
    default: TORCH_CHECK(false, "actbench::group_minmax: unknown dtype code ", code);
  }
  return {mn, mx};
}

// The CPU loop works on blocks of up to 256 values in three vectorizable passes (uniforms,
// codes, packing) over the same per-element functions the CUDA kernel calls chunk by chunk.
constexpr int64_t kBlock = 256;

// chunk_uniform of every value of `chunks` (at most kBlock / 8) consecutive chunks: the rounds of
// philox4x32_10 over arrays of counters, one per chunk. The portable loop below is the reference;
// on x86 with AVX2 (checked at run time: the build targets SSE2) eight chunks go through the
// rounds at once in 256-bit registers, with the same integer operations, so the same numbers.
void philox_uniforms_portable(uint64_t first_chunk, int64_t chunks, uint64_t seed, uint64_t offset, float* u) {
  for (int64_t c = 0; c < chunks; ++c) {
    const Uint4 r = philox4x32_10(first_chunk + static_cast<uint64_t>(c), seed, offset);
    for (int j = 0; j < 8; ++j) u[c * 8 + j] = chunk_uniform(r, j);
  }
}

#if defined(ACTBENCH_X86_AVX2)
ACTBENCH_AVX2 void philox_uniforms_avx2(uint64_t first_chunk, int64_t chunks, uint64_t seed, uint64_t offset,
                                        float* u) {
  const int64_t whole = chunks / 8 * 8;
  avx2::PhiloxKeys keys;
  avx2::philox_keys(seed, &keys);
  for (int64_t c = 0; c < whole; c += 8) {
    __m256i words[4];
    __m256 v[8];  // v[j]: value j of chunks c..c+7; transposed, v[l]: chunk c + l's 8 values
    avx2::philox8(first_chunk + static_cast<uint64_t>(c), keys, offset, words);
    avx2::uniforms8(words, v);
    avx2::transpose8(v);
    for (int l = 0; l < 8; ++l) _mm256_storeu_ps(u + (c + l) * 8, v[l]);
  }
  philox_uniforms_portable(first_chunk + static_cast<uint64_t>(whole), chunks - whole, seed, offset, u + whole * 8);
}
#endif

void philox_uniforms(uint64_t first_chunk, int64_t chunks, uint64_t seed, uint64_t offset, float* u) {
#if defined(ACTBENCH_X86_AVX2)
  if (has_avx2()) return philox_uniforms_avx2(first_chunk, chunks, seed, offset, u);
#endif
  philox_uniforms_portable(first_chunk, chunks, seed, offset, u);
}

template <int D>
void quantize_block(const typename Format<D>::T* sample, int64_t per_sample, int64_t first, int64_t len,
                    const GroupParams& p, int bits, uint64_t first_chunk, uint64_t seed, uint64_t offset,
                    uint8_t* out) {
  const int64_t chunks = len / 8;
#if defined(ACTBENCH_X86_AVX2)
  if constexpr (D == kF32) {  // whole 64-value stretches of a finite group: the AVX2 block
    if (p.finite && len % 64 == 0 && first + len <= per_sample && avx2::packs_in_word(bits) && has_avx2()) {
      const float* x = sample + first;
      switch (bits) {
        case 1: avx2::quantize_chunks_f32<1>(x, chunks, p, first_chunk, seed, offset, out); return;
        case 2: avx2::quantize_chunks_f32<2>(x, chunks, p, first_chunk, seed, offset, out); return;
        case 4: avx2::quantize_chunks_f32<4>(x, chunks, p, first_chunk, seed, offset, out); return;
        default: TORCH_CHECK(false, "actbench::quantize: no 64-value block for ", bits, " bits");
      }
    }
  }
#endif
  float u[kBlock];
  uint32_t q[kBlock];
  philox_uniforms(first_chunk, chunks, seed, offset, u);
  const int64_t valid = std::max<int64_t>(0, std::min(len, per_sample - first));
  for (int64_t i = 0; i < valid; ++i) q[i] = stochastic_code(Format<D>::load(sample[first + i]), p, u[i], bits);
  for (int64_t i = valid; i < len; ++i) q[i] = 0u;  // padding of the last group
  for (int64_t c = 0; c < chunks; ++c) pack8(q + c * 8, bits, out + c * bits);
}

// unpack8 with the width known at compile time, so its loops unroll.
template <int B>
void unpack_block(const uint8_t* in, int64_t chunks, uint32_t* q) {
  for (int64_t c = 0; c < chunks; ++c) unpack8(in + c * B, B, q + c * 8);
}

// The codes of len / 8 chunks of `bits` bits each, one per value.
inline void unpack_codes(const uint8_t* in, int bits, int64_t chunks, uint32_t* q) {
  switch (bits) {
    case 1: unpack_block<1>(in, chunks, q); break;
    case 2: unpack_block<2>(in, chunks, q); break;
    case 3: unpack_block<3>(in, chunks, q); break;
    case 4: unpack_block<4>(in, chunks, q); break;
    case 5: unpack_block<5>(in, chunks, q); break;
    case 6: unpack_block<6>(in, chunks, q); break;
    case 7: unpack_block<7>(in, chunks, q); break;
    case 8: unpack_block<8>(in, chunks, q); break;
    default: TORCH_CHECK(false, "actbench::dequantize: bits must be in 1..8, got ", bits);
  }
}

#if defined(ACTBENCH_X86_AVX2)
// dequantize_block for fp32 at up to 4 bits (at most 16 levels): dequantize_code of each level once,
// into a table, then a lookup per value instead of a division, so the values are the division's.
// Whole 64-value stretches at 1, 2 and 4 bits unpack in registers; the rest unpacks code by code.
ACTBENCH_AVX2 void dequantize_block_f32_avx2(const uint8_t* in, int bits, float lo, float scale, int64_t per_sample,
                                             int64_t first, int64_t len, float* sample) {
  alignas(32) float table[16] = {};
  for (uint32_t level = 0; level < (1u << bits); ++level) table[level] = dequantize_code(level, lo, scale);
  if (len % 64 == 0 && first + len <= per_sample && avx2::packs_in_word(bits)) {
    switch (bits) {
      case 1: avx2::dequantize_chunks_f32<1>(in, len / 8, table, sample + first); return;
      case 2: avx2::dequantize_chunks_f32<2>(in, len / 8, table, sample + first); return;
      case 4: avx2::dequantize_chunks_f32<4>(in, len / 8, table, sample + first); return;
      default: TORCH_CHECK(false, "actbench::dequantize: no 64-value block for ", bits, " bits");
    }
  }
  uint32_t q[kBlock];
  unpack_codes(in, bits, len / 8, q);
  avx2::lookup_f32(q, std::max<int64_t>(0, std::min(len, per_sample - first)), table, sample + first);
}
#endif

template <int D>
void dequantize_block(const uint8_t* in, int bits, float lo, float scale, int64_t per_sample, int64_t first,
                      int64_t len, typename Format<D>::T* sample) {
#if defined(ACTBENCH_X86_AVX2)
  if constexpr (D == kF32) {
    if (bits <= 4 && has_avx2()) return dequantize_block_f32_avx2(in, bits, lo, scale, per_sample, first, len, sample);
  }
#endif
  uint32_t q[kBlock];
  unpack_codes(in, bits, len / 8, q);
  const int64_t valid = std::max<int64_t>(0, std::min(len, per_sample - first));
  for (int64_t i = 0; i < valid; ++i) sample[first + i] = Format<D>::store(dequantize_code(q[i], lo, scale));
}

template <int D>
void quantize_groups(const at::Tensor& x, const Groups& gr, const float* mn, const float* mx, SampleLayout layout,
                     uint64_t seed, uint64_t offset, uint8_t* codes, uint16_t* lo, uint16_t* scale) {
  using T = typename Format<D>::T;
  const T* data = reinterpret_cast<const T*>(x.data_ptr());
  const int64_t cps = gr.chunks_per_sample();
  at::parallel_for(0, gr.n * gr.g, kGroupGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t n = t / gr.g, gi = t % gr.g;
      int bits = layout.bits_of(n);
      float a, b;
      if (mn != nullptr) {
        a = mn[t];
        b = mx[t];
      } else {  // one pass: the group's range while its 256 values are in cache, then its codes
        int64_t first = gi * gr.group_size;
        group_range<D>(data + n * gr.per_sample + first, std::min(gr.group_size, gr.per_sample - first), &a, &b);
      }
      GroupParams p = group_params(a, b, bits);
      lo[t] = p.lo_bits;
      scale[t] = p.scale_bits;
      uint8_t* out = codes + layout.start_of(n, cps);
      for (int64_t first = gi * gr.group_size; first < (gi + 1) * gr.group_size; first += kBlock) {
        int64_t len = std::min(kBlock, (gi + 1) * gr.group_size - first);
        quantize_block<D>(data + n * gr.per_sample, gr.per_sample, first, len, p, bits,
                          static_cast<uint64_t>(n * cps + first / 8), seed, offset, out + first / 8 * bits);
      }
    }
  });
}

template <int D>
void dequantize_groups(const uint8_t* codes, const uint16_t* lo, const uint16_t* scale, const Groups& gr,
                       SampleLayout layout, void* out_ptr) {
  using T = typename Format<D>::T;
  T* out = reinterpret_cast<T*>(out_ptr);
  const int64_t cps = gr.chunks_per_sample();
  at::parallel_for(0, gr.n * gr.g, kGroupGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t n = t / gr.g, gi = t % gr.g;
      int bits = layout.bits_of(n);
      float l = bf16_to_float(lo[t]), s = bf16_to_float(scale[t]);
      const uint8_t* in = codes + layout.start_of(n, cps);
      for (int64_t first = gi * gr.group_size; first < (gi + 1) * gr.group_size; first += kBlock) {
        int64_t len = std::min(kBlock, (gi + 1) * gr.group_size - first);
        dequantize_block<D>(in + first / 8 * bits, bits, l, s, gr.per_sample, first, len, out + n * gr.per_sample);
      }
    }
  });
}

// Byte offset of each sample's codes: chunks_per_sample * exclusive prefix sum of bits.
std::vector<int64_t> byte_starts(const at::Tensor& bits_cpu, const Groups& gr) {
  std::vector<int64_t> starts(gr.n);
  const int32_t* b = bits_cpu.data_ptr<int32_t>();
  int64_t acc = 0;
  for (int64_t i = 0; i < gr.n; ++i) {
    starts[i] = acc * gr.chunks_per_sample();
    acc += b[i];
  }
  return starts;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_impl(const char* op, const at::Tensor& x_in,
                                                             const at::Tensor& mn_in, const at::Tensor& mx_in,
                                                             SampleLayout layout, int64_t total_bits,
                                                             int64_t group_size, int64_t seed, int64_t offset) {
  Groups gr = groups_of(x_in.sizes(), group_size, op);
  int code = dtype_code(x_in.scalar_type(), op, "x");
  const bool fused = check_minmax(x_in, mn_in, mx_in, gr, op);
  at::Tensor x = x_in.contiguous(), mn = mn_in.contiguous(), mx = mx_in.contiguous();
  at::Tensor codes = empty_output({gr.chunks_per_sample() * total_bits}, x.options().dtype(at::kByte));
  at::Tensor lo = at::empty({gr.n, gr.g}, x.options().dtype(at::kBFloat16));
  at::Tensor scale = at::empty({gr.n, gr.g}, x.options().dtype(at::kBFloat16));
  auto* pc = codes.data_ptr<uint8_t>();
  auto* pl = reinterpret_cast<uint16_t*>(lo.data_ptr());
  auto* ps = reinterpret_cast<uint16_t*>(scale.data_ptr());
  const float* pmn = fused ? nullptr : mn.data_ptr<float>();
  const float* pmx = fused ? nullptr : mx.data_ptr<float>();
  auto s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  switch (code) {
    case kF32: quantize_groups<kF32>(x, gr, pmn, pmx, layout, s, o, pc, pl, ps); break;
    case kF16: quantize_groups<kF16>(x, gr, pmn, pmx, layout, s, o, pc, pl, ps); break;
    case kBF16: quantize_groups<kBF16>(x, gr, pmn, pmx, layout, s, o, pc, pl, ps); break;
    default: TORCH_CHECK(false, "actbench::", op, ": unknown dtype code ", code);
  }
  return {codes, lo, scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& x, const at::Tensor& mn,
                                                            const at::Tensor& mx, int64_t bits, int64_t group_size,
                                                            int64_t seed, int64_t offset) {
  check_uniform_bits(bits, "quantize");
  SampleLayout layout{static_cast<int>(bits), nullptr, nullptr};
  int64_t n = x.dim() > 0 ? x.size(0) : 0;
  return quantize_impl("quantize", x, mn, mx, layout, bits * n, group_size, seed, offset);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_mixed_cpu(const at::Tensor& x, const at::Tensor& mn,
                                                                  const at::Tensor& mx, const at::Tensor& bits_in,
                                                                  int64_t total_bits, int64_t group_size,
                                                                  int64_t seed, int64_t offset) {
  Groups gr = groups_of(x.sizes(), group_size, "quantize_mixed");
  check_mixed_bits(bits_in, gr, "quantize_mixed");
  at::Tensor bits = bits_in.contiguous();
  check_mixed_bits_values(bits, total_bits, "quantize_mixed");
  std::vector<int64_t> starts = byte_starts(bits, gr);
  SampleLayout layout{0, bits.data_ptr<int32_t>(), starts.data()};
  return quantize_impl("quantize_mixed", x, mn, mx, layout, total_bits, group_size, seed, offset);
}

at::Tensor dequantize_impl(const char* op, const at::Tensor& codes_in, const at::Tensor& lo_in,
                           const at::Tensor& scale_in, SampleLayout layout, int64_t total_bits, int64_t group_size,
                           c10::SymIntArrayRef shape_sym, at::ScalarType dtype) {
  c10::IntArrayRef shape = C10_AS_INTARRAYREF_SLOW(shape_sym);
  Groups gr = groups_of(shape, group_size, op);
  int code = dtype_code(dtype, op, "dtype");
  check_packed(codes_in, lo_in, scale_in, gr, op);
  TORCH_CHECK(codes_in.numel() == gr.chunks_per_sample() * total_bits, "actbench::", op, ": codes must hold ",
              gr.chunks_per_sample() * total_bits, " bytes for shape ", shape, ", got ", codes_in.numel());
  at::Tensor codes = codes_in.contiguous(), lo = lo_in.contiguous(), scale = scale_in.contiguous();
  at::Tensor out = empty_output(shape, codes.options().dtype(dtype));
  const auto* pc = codes.data_ptr<uint8_t>();
  const auto* pl = reinterpret_cast<const uint16_t*>(lo.data_ptr());
  const auto* ps = reinterpret_cast<const uint16_t*>(scale.data_ptr());
  switch (code) {
    case kF32: dequantize_groups<kF32>(pc, pl, ps, gr, layout, out.data_ptr()); break;
    case kF16: dequantize_groups<kF16>(pc, pl, ps, gr, layout, out.data_ptr()); break;
    case kBF16: dequantize_groups<kBF16>(pc, pl, ps, gr, layout, out.data_ptr()); break;
    default: TORCH_CHECK(false, "actbench::", op, ": unknown dtype code ", code);
  }
  return out;
}

at::Tensor dequantize_cpu(const at::Tensor& codes, const at::Tensor& lo, const at::Tensor& scale, int64_t bits,
                          int64_t group_size, c10::SymIntArrayRef shape, at::ScalarType dtype) {
  check_uniform_bits(bits, "dequantize");
  SampleLayout layout{static_cast<int>(bits), nullptr, nullptr};
  int64_t n = shape.empty() ? 0 : shape[0].guard_int(__FILE__, __LINE__);
  return dequantize_impl("dequantize", codes, lo, scale, layout, bits * n, group_size, shape, dtype);
}

at::Tensor dequantize_mixed_cpu(const at::Tensor& codes, const at::Tensor& lo, const at::Tensor& scale,
                                const at::Tensor& bits_in, int64_t group_size, c10::SymIntArrayRef shape,
                                at::ScalarType dtype) {
  Groups gr = groups_of(C10_AS_INTARRAYREF_SLOW(shape), group_size, "dequantize_mixed");
  check_mixed_bits(bits_in, gr, "dequantize_mixed");
  at::Tensor bits = bits_in.contiguous();
  check_mixed_bits_values(bits, -1, "dequantize_mixed");
  std::vector<int64_t> starts = byte_starts(bits, gr);
  int64_t total = 0;
  for (int64_t i = 0; i < gr.n; ++i) total += bits.data_ptr<int32_t>()[i];
  SampleLayout layout{0, bits.data_ptr<int32_t>(), starts.data()};
  return dequantize_impl("dequantize_mixed", codes, lo, scale, layout, total, group_size, shape, dtype);
}

constexpr int64_t kMaskGrain = 8192;  // packed bytes per parallel task: 64 Ki values

// 8 bool bytes (0 or 1) -> one byte, least significant bit first: one multiply gathers the
// eight low bits into the top byte.
inline uint8_t pack8_bools(const bool* m) {
  uint64_t w;
  memcpy(&w, m, sizeof(w));
  return static_cast<uint8_t>(((w & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
}

void pack_bools(const bool* m, int64_t numel, uint8_t* o) {
  const int64_t full = numel / 8;
  at::parallel_for(0, full, kMaskGrain, [&](int64_t begin, int64_t end) {
    const bool* src = m;  // locals, see kLocalCopies
    uint8_t* dst = o;
    for (int64_t i = begin; i < end; ++i) dst[i] = pack8_bools(src + i * 8);
  });
  if (full * 8 < numel) {
    uint8_t byte = 0;
    for (int64_t idx = full * 8; idx < numel; ++idx) byte |= static_cast<uint8_t>(m[idx] ? 1u : 0u) << (idx - full * 8);
    o[full] = byte;
  }
}

// A float tensor's mask is value > 0 (mask_bit), read straight from a ReLU's output.
// Eight float32 values -> one byte with two 4-lane ordered compares (NaN and -0 give 0, as
// mask_bit) and their sign bits gathered: the scalar loop below took 4x a ReLU's own pass.
inline bool pack_byte_f32(const float* v, uint8_t* o) {
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  const int lo = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(v), zero));
  const int hi = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(v + 4), zero));
  *o = static_cast<uint8_t>(lo | (hi << 4));
  return true;
#else
  (void)v, (void)o;
  return false;
#endif
}

#if defined(ACTBENCH_X86_AVX2)
// Mask bytes [begin, end), each a whole 8 values: pack_byte_f32 in one 8-lane register.
__attribute__((target("avx2"))) void pack_f32_avx2(const float* v, int64_t begin, int64_t end, uint8_t* o) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t i = begin; i < end; ++i) {
    o[i] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i * 8), zero, _CMP_GT_OQ)));
  }
}
#endif

template <int D>
void pack_values(const typename Format<D>::T* v, int64_t numel, uint8_t* o) {
  const int64_t full = numel / 8;
  at::parallel_for(0, full, kMaskGrain, [&](int64_t begin, int64_t end) {
    const typename Format<D>::T* src = v;  // locals, see kLocalCopies
    uint8_t* dst = o;
    if constexpr (D == kF32) {
#if defined(ACTBENCH_X86_AVX2)
      if (has_avx2()) return pack_f32_avx2(src, begin, end, dst);
#endif
      if (begin < end && pack_byte_f32(src + begin * 8, dst + begin)) {
        for (int64_t i = begin + 1; i < end; ++i) pack_byte_f32(src + i * 8, dst + i);
        return;
      }
    }
    for (int64_t i = begin; i < end; ++i) {
      uint32_t byte = 0;
      for (int j = 0; j < 8; ++j) byte |= mask_bit(Format<D>::load(src[i * 8 + j])) << j;
      dst[i] = static_cast<uint8_t>(byte);
    }
  });
  if (full * 8 < numel) {
    uint32_t byte = 0;
    for (int64_t idx = full * 8; idx < numel; ++idx) byte |= mask_bit(Format<D>::load(v[idx])) << (idx - full * 8);
    o[full] = static_cast<uint8_t>(byte);
  }
}

at::Tensor pack_mask_cpu(const at::Tensor& mask_in) {
  const char* op = "pack_mask";
  const int code = mask_code(mask_in.scalar_type(), op);
  at::Tensor mask = mask_in.contiguous();
  const int64_t numel = mask.numel();
  at::Tensor out = empty_output({(numel + 7) / 8}, mask.options().dtype(at::kByte));
  uint8_t* o = out.data_ptr<uint8_t>();
  const void* m = mask.data_ptr();
  switch (code) {
    case -1: pack_bools(static_cast<const bool*>(m), numel, o); break;
    case kF32: pack_values<kF32>(static_cast<const float*>(m), numel, o); break;
    case kF16: pack_values<kF16>(static_cast<const uint16_t*>(m), numel, o); break;
    case kBF16: pack_values<kBF16>(static_cast<const uint16_t*>(m), numel, o); break;
    default: TORCH_CHECK(false, "actbench::", op, ": unknown mask code ", code);
  }
  return out;
}

// Byte b -> eight bool bytes (bit j of b in byte j): a 2 KiB table, built once.
struct SpreadTable {
  uint64_t v[256];
  SpreadTable() {
    for (int b = 0; b < 256; ++b) {
      uint64_t w = 0;
      for (int j = 0; j < 8; ++j) w |= static_cast<uint64_t>((b >> j) & 1) << (8 * j);
      v[b] = w;
    }
  }
};

const SpreadTable& spread_table() {
  static const SpreadTable table;
  return table;
}

at::Tensor unpack_mask_cpu(const at::Tensor& packed_in, c10::SymIntArrayRef shape_sym) {
  c10::IntArrayRef shape = C10_AS_INTARRAYREF_SLOW(shape_sym);
  const int64_t numel = check_unpack_mask(packed_in, shape, "unpack_mask");
  at::Tensor packed = packed_in.contiguous();
  at::Tensor out = empty_output(shape, packed.options().dtype(at::kBool));
  const uint8_t* p = packed.data_ptr<uint8_t>();
  bool* o = out.data_ptr<bool>();
  const SpreadTable& table = spread_table();
  const int64_t full = numel / 8;
  at::parallel_for(0, full, kMaskGrain, [&](int64_t begin, int64_t end) {
    const uint8_t* src = p;  // locals, see kLocalCopies
    bool* dst = o;
    const uint64_t* spread = table.v;
    for (int64_t i = begin; i < end; ++i) memcpy(dst + i * 8, &spread[src[i]], 8);
  });
  for (int64_t idx = full * 8; idx < numel; ++idx) o[idx] = (p[full] >> (idx - full * 8)) & 1u;
  return out;
}

// grad * scale where the packed mask is set, else 0, in one pass (no bool tensor in between).
// Eight float32 values of one mask byte: masked_value with 4-lane compares (the same IEEE
// multiply, and +0 where the bit is clear).
inline bool apply_mask_byte_f32(const float* g, uint32_t byte, float scale, float* o) {
#if defined(__SSE2__)
  const __m128i lo = _mm_setr_epi32(1, 2, 4, 8), hi = _mm_setr_epi32(16, 32, 64, 128);
  const __m128i b = _mm_set1_epi32(static_cast<int>(byte));
  const __m128 s = _mm_set1_ps(scale);
  const __m128 m0 = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, lo), lo));
  const __m128 m1 = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, hi), hi));
  _mm_storeu_ps(o, _mm_and_ps(m0, _mm_mul_ps(_mm_loadu_ps(g), s)));
  _mm_storeu_ps(o + 4, _mm_and_ps(m1, _mm_mul_ps(_mm_loadu_ps(g + 4), s)));
  return true;
#else
  (void)g, (void)byte, (void)scale, (void)o;
  return false;
#endif
}

#if defined(ACTBENCH_X86_AVX2)
// Mask bytes [begin, end), each a whole 8 values: apply_mask_byte_f32 in one 8-lane register.
__attribute__((target("avx2"))) void apply_mask_f32_avx2(const float* g, const uint8_t* p, int64_t begin,
                                                         int64_t end, float scale, float* o) {
  const __m256i select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t i = begin; i < end; ++i) {
    const __m256i b = _mm256_set1_epi32(p[i]);
    const __m256 m = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, select), select));
    _mm256_storeu_ps(o + i * 8, _mm256_and_ps(m, _mm256_mul_ps(_mm256_loadu_ps(g + i * 8), s)));
  }
}
#endif

template <int D>
void apply_mask_values(const typename Format<D>::T* g, const uint8_t* p, int64_t numel, float scale,
                       typename Format<D>::T* o) {
  const int64_t bytes = (numel + 7) / 8;
  at::parallel_for(0, bytes, kMaskGrain, [&](int64_t begin, int64_t end) {
#if defined(ACTBENCH_X86_AVX2)
    if constexpr (D == kF32) {
      if (has_avx2()) {
        const int64_t whole = std::min(end, numel / 8);
        if (begin < whole) apply_mask_f32_avx2(g, p, begin, whole, scale, o);
        begin = std::max(begin, whole);
      }
    }
#endif
    for (int64_t i = begin; i < end; ++i) {
      if constexpr (D == kF32) {
        if (i * 8 + 8 <= numel && apply_mask_byte_f32(g + i * 8, p[i], scale, o + i * 8)) continue;
      }
      const uint32_t byte = p[i];
      const int64_t len = std::min<int64_t>(8, numel - i * 8);
      for (int64_t j = 0; j < len; ++j) {
        o[i * 8 + j] = Format<D>::store(masked_value(Format<D>::load(g[i * 8 + j]), (byte >> j) & 1u, scale));
      }
    }
  });
}

at::Tensor apply_mask_cpu(const at::Tensor& grad_in, const at::Tensor& packed_in, double scale) {
  const char* op = "apply_mask";
  const int code = dtype_code(grad_in.scalar_type(), op, "grad");
  const int64_t numel = check_unpack_mask(packed_in, grad_in.sizes(), op);
  at::Tensor grad = grad_in.contiguous(), packed = packed_in.contiguous();
  at::Tensor out = empty_output(grad.sizes(), grad.options());
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const float s = static_cast<float>(scale);
  switch (code) {
    case kF32:
      apply_mask_values<kF32>(grad.data_ptr<float>(), p, numel, s, out.data_ptr<float>());
      break;
    case kF16:
      apply_mask_values<kF16>(static_cast<const uint16_t*>(grad.data_ptr()), p, numel, s,
                              static_cast<uint16_t*>(out.data_ptr()));
      break;
    case kBF16:
      apply_mask_values<kBF16>(static_cast<const uint16_t*>(grad.data_ptr()), p, numel, s,
                               static_cast<uint16_t*>(out.data_ptr()));
      break;
    default: TORCH_CHECK(false, "actbench::", op, ": unknown dtype code ", code);
  }
  return out;
}

// Windows of outputs [0, count) of one row, all inside the input, starting at `base` (output 0's
// window origin). Window positions are visited in window_argmax's order (i, then j) for every
// output at once, so the inner loop over outputs vectorizes; the rule is window_argmax's (the
// first maximum, or the last NaN), so value and index equal the scalar function's.
template <int D, int SW>
void pool_row_inside(const typename Format<D>::T* base, const Pool2d& p, int64_t count, float* best, int32_t* arg) {
  const int64_t sw = SW > 0 ? SW : p.sw;
  for (int64_t ow = 0; ow < count; ++ow) {
    best[ow] = Format<D>::load(base[ow * sw]);
    arg[ow] = 0;
  }
  for (int i = 0; i < p.kh; ++i) {
    for (int j = (i == 0 ? 1 : 0); j < p.kw; ++j) {
      const typename Format<D>::T* src = base + static_cast<int64_t>(i) * p.dh * p.in_w + static_cast<int64_t>(j) * p.dw;
      const int32_t k = i * p.kw + j;
      for (int64_t ow = 0; ow < count; ++ow) {
        const float v = Format<D>::load(src[ow * sw]);
        const bool take = (v > best[ow]) | (v != v);  // v != v: NaN, as is_nan
        best[ow] = take ? v : best[ow];
        arg[ow] = take ? k : arg[ow];
      }
    }
  }
}

template <int D>
void pool_forward_planes(const at::Tensor& x, const Pool2d& p, int64_t planes, at::Tensor& out, at::Tensor& arg) {
  using T = typename Format<D>::T;
  const T* in = reinterpret_cast<const T*>(x.data_ptr());
  T* o = reinterpret_cast<T*>(out.data_ptr());
  int8_t* a = arg.data_ptr<int8_t>();
  const int64_t in_plane = p.in_h * p.in_w, out_plane = p.out_h * p.out_w;
  // Outputs [ow_lo, ow_hi) of a row have their window inside the input horizontally.
  const int64_t ow_lo = std::min<int64_t>(p.out_w, (p.pw + p.sw - 1) / p.sw);
  const int64_t last_w = p.in_w - 1 - static_cast<int64_t>(p.kw - 1) * p.dw + p.pw;  // largest inside ow * sw
  const int64_t ow_hi = last_w < 0 ? ow_lo : std::max(ow_lo, std::min<int64_t>(p.out_w, last_w / p.sw + 1));
  constexpr int64_t kSpan = 256;  // outputs per vectorized stretch
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    float best[kSpan];
    int32_t idx[kSpan];
    for (int64_t c = begin; c < end; ++c) {
      const T* plane = in + c * in_plane;
      for (int64_t oh = 0; oh < p.out_h; ++oh) {
        const int64_t h0 = oh * p.sh - p.ph;
        const bool rows_inside = h0 >= 0 && h0 + static_cast<int64_t>(p.kh - 1) * p.dh < p.in_h;
        const int64_t lo = rows_inside ? ow_lo : p.out_w, hi = rows_inside ? ow_hi : p.out_w;
        T* orow = o + c * out_plane + oh * p.out_w;
        int8_t* arow = a + c * out_plane + oh * p.out_w;
        for (int64_t ow = 0; ow < p.out_w; ++ow) {
          if (ow == lo) ow = hi;  // [lo, hi) is done below, vectorized
          if (ow >= p.out_w) break;
          float b;
          arow[ow] = window_argmax<Format<D>>(plane, p, oh, ow, &b);
          orow[ow] = Format<D>::store(b);
        }
        for (int64_t s = lo; s < hi; s += kSpan) {
          const int64_t count = std::min(kSpan, hi - s);
          const T* base = plane + h0 * p.in_w + (s * p.sw - p.pw);
          if (p.sw == 1) {  // the common strides get a constant stride, so their loads vectorize
            pool_row_inside<D, 1>(base, p, count, best, idx);
          } else if (p.sw == 2) {
            pool_row_inside<D, 2>(base, p, count, best, idx);
          } else {
            pool_row_inside<D, 0>(base, p, count, best, idx);
          }
          for (int64_t q = 0; q < count; ++q) {
            arow[s + q] = static_cast<int8_t>(idx[q]);
            orow[s + q] = Format<D>::store(best[q]);
          }
        }
      }
    }
  });
}

// Scatter of each output's gradient to its argmax, outputs in descending order: every input then
// adds its contributions in the order of the gather (pool_input_grad, the CUDA kernel's), starting
// from 0, so the two agree bit for bit. fp32 accumulates in the output itself; 16-bit formats in
// one float plane of scratch per task, rounded once at the end. An argmax naming a position outside
// its window or outside the input (only a caller's own argmax can) adds nothing, as in the gather:
// the scatter never writes outside the plane.
template <int D>
void pool_backward_planes(const at::Tensor& grad, const at::Tensor& arg, const Pool2d& p, int64_t planes,
                          at::Tensor& gin) {
  using T = typename Format<D>::T;
  const T* g = reinterpret_cast<const T*>(grad.data_ptr());
  const int8_t* a = arg.data_ptr<int8_t>();
  T* o = reinterpret_cast<T*>(gin.data_ptr());
  const int64_t in_plane = p.in_h * p.in_w, out_plane = p.out_h * p.out_w;
  // window index (below 128: the int8 argmax) -> row and column offsets from the window's origin and
  // their flat offset; an index past the window gets a row offset no bounds check lets through
  const int64_t in_h = p.in_h, in_w = p.in_w, out_h = p.out_h, out_w = p.out_w, sh = p.sh, sw = p.sw;
  const int window = p.kh * p.kw;
  int64_t di[128], dj[128], offset[128];
  for (int k = 0; k < 128; ++k) {
    di[k] = k < window ? int64_t{k / p.kw} * p.dh : -(int64_t{1} << 40);
    dj[k] = k < window ? int64_t{k % p.kw} * p.dw : 0;
    offset[k] = k < window ? di[k] * in_w + dj[k] : 0;
  }
  // Windows wholly inside the input (rows with h0 >= 0 and h0 + span_h < in_h, columns ow_lo <= ow <
  // ow_hi) take any index of the window without a bounds check; the border ones check each.
  const int64_t span_h = int64_t{p.kh - 1} * p.dh, span_w = int64_t{p.kw - 1} * p.dw;
  const int64_t ow_lo = std::min(out_w, (int64_t{p.pw} + sw - 1) / sw);
  const int64_t last = in_w - 1 - span_w + p.pw;  // the largest ow * sw whose window ends inside
  const int64_t ow_hi = std::max(ow_lo, std::min(out_w, last < 0 ? int64_t{0} : last / sw + 1));
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(D == kF32 ? 0 : in_plane);
    for (int64_t c = begin; c < end; ++c) {
      float* acc = D == kF32 ? reinterpret_cast<float*>(o + c * in_plane) : scratch.data();
      std::fill(acc, acc + in_plane, 0.0f);
      const T* gp = g + c * out_plane;
      const int8_t* ap = a + c * out_plane;
      for (int64_t oh = out_h - 1; oh >= 0; --oh) {
        const int64_t h0 = oh * sh - p.ph;  // output (oh, ow)'s window origin: (h0, ow * sw - pw)
        const T* grow = gp + oh * out_w;
        const int8_t* arow = ap + oh * out_w;
        auto checked = [&](int64_t from, int64_t to) {  // outputs from - 1 down to to
          for (int64_t ow = from - 1; ow >= to; --ow) {
            const int8_t k = arow[ow];
            if (k < 0) continue;
            const int64_t h = h0 + di[k], w = ow * sw - p.pw + dj[k];
            const bool inside = static_cast<uint64_t>(h) < static_cast<uint64_t>(in_h) &&
                                static_cast<uint64_t>(w) < static_cast<uint64_t>(in_w);
            if (inside) acc[h * in_w + w] += Format<D>::load(grow[ow]);
          }
        };
        if (h0 < 0 || h0 + span_h >= in_h) {
          checked(out_w, 0);
          continue;
        }
        checked(out_w, ow_hi);
        float* base = acc + h0 * in_w - p.pw;
        for (int64_t ow = ow_hi - 1; ow >= ow_lo; --ow) {
          const uint8_t k = static_cast<uint8_t>(arow[ow]);  // -1 (no window) becomes 255
          if (k >= window) continue;
          base[ow * sw + offset[k]] += Format<D>::load(grow[ow]);
        }
        checked(ow_lo, 0);
      }
      if constexpr (D != kF32) {
        T* op = o + c * in_plane;
        for (int64_t i = 0; i < in_plane; ++i) op[i] = Format<D>::store(acc[i]);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_argmax_cpu(const at::Tensor& x_in, c10::IntArrayRef kernel,
                                                              c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                              c10::IntArrayRef dilation, bool ceil_mode) {
  const char* op = "max_pool2d_with_argmax";
  Pool2d p = pool_geometry(x_in.sizes(), kernel, stride, padding, dilation, ceil_mode, op);
  int code = dtype_code(x_in.scalar_type(), op, "x");
  at::Tensor x = x_in.contiguous();
  std::vector<int64_t> shape = pool_output_shape(x.sizes(), p);
  at::Tensor out = empty_output(shape, x.options()), arg = empty_output(shape, x.options().dtype(at::kChar));
  int64_t planes = x.numel() / (p.in_h * p.in_w);
  switch (code) {
    case kF32: pool_forward_planes<kF32>(x, p, planes, out, arg); break;
    case kF16: pool_forward_planes<kF16>(x, p, planes, out, arg); break;
    case kBF16: pool_forward_planes<kBF16>(x, p, planes, out, arg); break;
    default: TORCH_CHECK(false, "actbench::", op, ": unknown dtype code ", code);
  }
  return {out, arg};
}

at::Tensor max_pool2d_backward_cpu(const at::Tensor& grad_in, const at::Tensor& arg_in, c10::SymIntArrayRef in_sym,
                                   c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                   c10::IntArrayRef dilation) {
  const char* op = "max_pool2d_backward";
  c10::IntArrayRef in_shape = C10_AS_INTARRAYREF_SLOW(in_sym);
  Pool2d p = pool_backward_geometry(grad_in, arg_in, in_shape, kernel, stride, padding, dilation, op);
  int code = dtype_code(grad_in.scalar_type(), op, "grad_out");
  at::Tensor grad = grad_in.contiguous(), arg = arg_in.contiguous();
  at::Tensor gin = empty_output(in_shape, grad.options());
  int64_t planes = gin.numel() / (p.in_h * p.in_w);
  switch (code) {
    case kF32: pool_backward_planes<kF32>(grad, arg, p, planes, gin); break;
    case kF16: pool_backward_planes<kF16>(grad, arg, p, planes, gin); break;
    case kBF16: pool_backward_planes<kBF16>(grad, arg, p, planes, gin); break;
    default: TORCH_CHECK(false, "actbench::", op, ": unknown dtype code ", code);
  }
  return gin;
}

// Greedy allocation of docs/design.md §2. The objective is separable and convex in each b_i (every
// further decrement costs more), so repeatedly taking the cheapest decrement per unit of weight
// is optimal for equal weights and a good heuristic otherwise.
at::Tensor allocate_bits_cpu(const at::Tensor& cost_in, const at::Tensor& weight_in, double target, int64_t min_bits,
                             int64_t max_bits) {
  const char* op = "allocate_bits";
  TORCH_CHECK(cost_in.scalar_type() == at::kDouble && weight_in.scalar_type() == at::kDouble && cost_in.dim() == 1 &&
                  cost_in.sizes() == weight_in.sizes(),
              "actbench::", op, ": cost and weight must be float64 1-D tensors of one length, got ",
              cost_in.scalar_type(), " ", cost_in.sizes(), " and ", weight_in.scalar_type(), " ", weight_in.sizes());
  TORCH_CHECK(1 <= min_bits && min_bits <= max_bits && max_bits <= 8, "actbench::", op,
              ": need 1 <= min_bits <= max_bits <= 8, got min_bits=", min_bits, ", max_bits=", max_bits);
  at::Tensor cost = cost_in.contiguous(), weight = weight_in.contiguous();
  const double* c = cost.data_ptr<double>();
  const double* w = weight.data_ptr<double>();
  const int64_t k = cost.numel();
  double floor_total = 0.0, total = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    TORCH_CHECK(std::isfinite(c[i]) && c[i] >= 0.0, "actbench::", op, ": cost[", i,
                "] must be finite and >= 0, got ", c[i]);
    TORCH_CHECK(std::isfinite(w[i]) && w[i] > 0.0, "actbench::", op, ": weight[", i, "] must be finite and > 0, got ",
                w[i]);
    floor_total += w[i] * static_cast<double>(min_bits);
    total += w[i] * static_cast<double>(max_bits);
  }
  TORCH_CHECK(floor_total <= target, "actbench::", op, ": target ", target, " is below the smallest possible total ",
              floor_total, " (every item at min_bits=", min_bits, ")");
  at::Tensor out = at::empty({k}, cost.options().dtype(at::kInt));
  int32_t* b = out.data_ptr<int32_t>();
  auto inv_sq = [](int64_t bits) {
    double levels = static_cast<double>((int64_t{1} << bits) - 1);
    return 1.0 / (levels * levels);
  };
  using Item = std::pair<double, int64_t>;  // (added variance per unit weight, index): ties -> lower index
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (int64_t i = 0; i < k; ++i) {
    b[i] = static_cast<int32_t>(max_bits);
    if (max_bits > min_bits) heap.emplace(c[i] * (inv_sq(max_bits - 1) - inv_sq(max_bits)) / w[i], i);
  }
  while (total > target && !heap.empty()) {
    int64_t i = heap.top().second;
    heap.pop();
    b[i] -= 1;
    total -= w[i];
    if (b[i] > min_bits) heap.emplace(c[i] * (inv_sq(b[i] - 1) - inv_sq(b[i])) / w[i], i);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(actbench, CPU, m) {
  m.impl("group_minmax", &group_minmax_cpu);
  m.impl("quantize", &quantize_cpu);
  m.impl("quantize_mixed", &quantize_mixed_cpu);
  m.impl("dequantize", &dequantize_cpu);
  m.impl("dequantize_mixed", &dequantize_mixed_cpu);
  m.impl("pack_mask", &pack_mask_cpu);
  m.impl("unpack_mask", &unpack_mask_cpu);
  m.impl("apply_mask", &apply_mask_cpu);
  m.impl("max_pool2d_with_argmax", &max_pool2d_with_argmax_cpu);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cpu);
  m.impl("allocate_bits", &allocate_bits_cpu);
}

}  // namespace actbench
