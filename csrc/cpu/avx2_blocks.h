// AVX2 forms of the CPU kernels' inner blocks, chosen at run time (the build targets SSE2). Each
// computes exactly what the portable per-element functions of quant_math.h compute, with the same
// float operations in the same order (no fused multiply-add: the build passes -ffp-contract=off),
// so codes and values stay bit-identical to the portable loops, the CUDA kernels and the oracle.
//
// The layout trick: Philox gives the uniforms of 8 consecutive chunks as 8 registers "value j of
// chunks c..c+7". Transposing the 8x8 block of inputs into the same layout lets one register hold
// value j of 8 chunks, so the codes of 8 chunks pack with vertical shifts and ORs into one 32-bit
// word per chunk (widths up to 4 bits), and unpacking is the same in reverse.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#include "actbench/quant_math.h"

#define ACTBENCH_X86_AVX2 1
#define ACTBENCH_AVX2 __attribute__((target("avx2")))

namespace actbench {
namespace avx2 {

// 32 x 32 -> 64-bit products of eight lanes: high and low words, lane by lane.
ACTBENCH_AVX2 inline void mulhilo8(__m256i a, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(a, m);                        // lanes 0, 2, 4, 6 as 64 bits
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// The round keys of philox4x32_10 for one seed, broadcast: computed once per block of chunks.
struct PhiloxKeys {
  __m256i k0[10], k1[10];
};

ACTBENCH_AVX2 inline void philox_keys(uint64_t seed, PhiloxKeys* keys) {
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    keys->k0[r] = _mm256_set1_epi32(static_cast<int>(k0));
    keys->k1[r] = _mm256_set1_epi32(static_cast<int>(k1));
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// philox4x32_10 of chunks first_chunk .. first_chunk + 7, lane l = chunk first_chunk + l: the same
// integer operations as the portable function, eight counters at once. The counters are built in
// registers (low word + lane, high word + carry): written as scalars and read back as one vector,
// they stalled the load on every call.
ACTBENCH_AVX2 inline void philox8(uint64_t first_chunk, const PhiloxKeys& keys, uint64_t offset, __m256i words[4]) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i base_lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first_chunk)));
  __m256i c0 = _mm256_add_epi32(base_lo, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  // the low word wrapped (unsigned c0 < base) -> carry one into the high word; the mask is -1 there
  const __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(base_lo, sign), _mm256_xor_si256(c0, sign));
  __m256i c1 = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first_chunk >> 32))), wrapped);
  __m256i c2 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(offset)));
  __m256i c3 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(offset >> 32)));
  for (int r = 0; r < 10; ++r) {
    __m256i hi0, lo0, hi1, lo1;
    mulhilo8(c0, m0, &hi0, &lo0);
    mulhilo8(c2, m1, &hi1, &lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), keys.k0[r]);
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), keys.k1[r]);
    c1 = lo1;
    c3 = lo0;
  }
  words[0] = c0;
  words[1] = c1;
  words[2] = c2;
  words[3] = c3;
}

// Min and max of len (a multiple of 8) fp32 values, and whether any is NaN or +-inf: group_range's
// eight lanes, in one register each. min(v, m) is "v < m ? v : m" and max(v, m) "v > m ? v : m",
// group_range's comparisons, so the lanes hold the same values.
ACTBENCH_AVX2 inline void range_f32(const float* p, int64_t len, float lmn[8], float lmx[8], float lbad[8]) {
  __m256 mn = _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000)), mx = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0xFF800000u)));
  __m256 bad = _mm256_setzero_ps();
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < len; i += 8) {
    const __m256 v = _mm256_loadu_ps(p + i);
    mn = _mm256_min_ps(v, mn);
    mx = _mm256_max_ps(v, mx);
    bad = _mm256_add_ps(bad, _mm256_mul_ps(v, zero));
  }
  _mm256_storeu_ps(lmn, mn);
  _mm256_storeu_ps(lmx, mx);
  _mm256_storeu_ps(lbad, bad);
}

// chunk_uniform of value j (0..7) of eight chunks: word j / 2, its low (even j) or high half.
ACTBENCH_AVX2 inline void uniforms8(const __m256i words[4], __m256 u[8]) {
  const __m256 unit = _mm256_set1_ps(1.0f / 65536.0f);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  for (int w = 0; w < 4; ++w) {
    u[2 * w] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(words[w], low16)), unit);
    u[2 * w + 1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words[w], 16)), unit);
  }
}

// Rows become columns: r[i] lane j <- r[j] lane i.
ACTBENCH_AVX2 inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Widths whose 8 codes fit one 32-bit word and whose bytes store simply.
inline bool packs_in_word(int bits) { return bits == 1 || bits == 2 || bits == 4; }

// The low B bytes of each lane's word, lane by lane: chunk l's packed codes (pack8's layout).
template <int B>
ACTBENCH_AVX2 inline void store_words(__m256i word, uint8_t* out) {
  if constexpr (B == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), word);
  } else if constexpr (B == 2) {  // 16-bit halves of the 8 lanes, in lane order
    const __m256i packed = _mm256_packus_epi32(word, word);  // per 128-bit half: a0..a3 a0..a3
    const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(ordered));
  } else {
    alignas(32) uint32_t w[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(w), word);
    for (int l = 0; l < 8; ++l) out[l] = static_cast<uint8_t>(w[l]);
  }
}

template <int B>
ACTBENCH_AVX2 inline __m256i load_words(const uint8_t* in) {
  if constexpr (B == 4) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  } else if constexpr (B == 2) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
  } else {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)));
  }
}

// quantize_block's codes for `chunks` (a multiple of 8) whole chunks of fp32 values in a finite
// group: stochastic_code of each value with chunk_uniform's number, packed as pack8 packs them.
template <int B>
ACTBENCH_AVX2 void quantize_chunks_f32(const float* x, int64_t chunks, const GroupParams& p, uint64_t first_chunk,
                                       uint64_t seed, uint64_t offset, uint8_t* out) {
  const __m256 lo = _mm256_set1_ps(p.lo), scale = _mm256_set1_ps(p.scale);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(static_cast<float>((1 << B) - 1));
  PhiloxKeys keys;
  philox_keys(seed, &keys);
  for (int64_t c = 0; c < chunks; c += 8) {
    __m256i words[4];
    __m256 u[8], v[8];
    philox8(first_chunk + static_cast<uint64_t>(c), keys, offset, words);
    uniforms8(words, u);
    for (int l = 0; l < 8; ++l) v[l] = _mm256_loadu_ps(x + (c + l) * 8);
    transpose8(v);
    __m256i word = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      // stochastic_code: max(v, 0) is "v >= 0 ? v : 0" (NaN -> 0), min(v, top) "v < top ? v : top"
      __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v[j], lo), scale), u[j]);
      t = _mm256_min_ps(_mm256_max_ps(t, zero), top);
      word = _mm256_or_si256(word, _mm256_slli_epi32(_mm256_cvttps_epi32(t), j * B));
    }
    store_words<B>(word, out + c * B);
  }
}

// table[q] for codes q below 16: the table's halves in two registers, a permute from each and a
// select by bit 3.
ACTBENCH_AVX2 inline __m256 lookup16(__m256i q, __m256 low, __m256 high) {
  const __m256 from_high = _mm256_castsi256_ps(_mm256_slli_epi32(q, 28));  // bit 3 -> sign bit
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, q), _mm256_permutevar8x32_ps(high, q), from_high);
}

// out[i] = table[q[i]] for n codes below 16, eight at a time.
ACTBENCH_AVX2 inline void lookup_f32(const uint32_t* q, int64_t n, const float* table, float* out) {
  const __m256 low = _mm256_load_ps(table), high = _mm256_load_ps(table + 8);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, lookup16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), low, high));
  for (; i < n; ++i) out[i] = table[q[i]];
}

// dequantize_block's values for `chunks` (a multiple of 8) whole chunks: table[code], the table
// holding dequantize_code of each level.
template <int B>
ACTBENCH_AVX2 void dequantize_chunks_f32(const uint8_t* in, int64_t chunks, const float* table, float* out) {
  const __m256 low = _mm256_load_ps(table), high = _mm256_load_ps(table + 8);
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  for (int64_t c = 0; c < chunks; c += 8) {
    const __m256i word = load_words<B>(in + c * B);
    __m256 v[8];
    for (int j = 0; j < 8; ++j) v[j] = lookup16(_mm256_and_si256(_mm256_srli_epi32(word, j * B), mask), low, high);
    transpose8(v);
    for (int l = 0; l < 8; ++l) _mm256_storeu_ps(out + (c + l) * 8, v[l]);
  }
}

}  // namespace avx2
}  // namespace actbench
#endif
