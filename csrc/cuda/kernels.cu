// CUDA kernels of the actbench ops, through the same __host__ __device__ functions the CPU loops
// call (quant_math.h). quantize and group_minmax run one warp per group; dequantize and apply_mask one
// thread per 8-value chunk (16-byte loads and stores where aligned); every other kernel one thread
// per value it writes, so a warp's loads and stores are consecutive (coalesced). Grid-stride
// loops, with 32-bit indices where a launch's indices fit (GPU integer division costs several
// times more at 64 bits) and 64-bit ones otherwise, so tensors over 2^31 values and batches over
// 65,535 work.
#include "launchers.h"

namespace actbench {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

inline unsigned blocks_for(int64_t work, int threads = kThreads) {
  int64_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// One warp per group; lanes stride through it (coalesced), then reduce with shuffles.
template <int D>
__global__ void group_minmax_kernel(const typename Format<D>::T* __restrict__ x, Groups gr, float* __restrict__ mn,
                                    float* __restrict__ mx) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() / 32;
  for (int64_t t = global_thread() / 32; t < gr.n * gr.g; t += warps) {
    int64_t n = t / gr.g, gi = t % gr.g;
    int64_t first = gi * gr.group_size;
    int64_t len = gr.per_sample - first < gr.group_size ? gr.per_sample - first : gr.group_size;
    const typename Format<D>::T* p = x + n * gr.per_sample + first;
    float a = bits_float(0x7F800000u), b = bits_float(0xFF800000u), bad = 0.0f;
    for (int64_t i = lane; i < len; i += 32) {
      float v = Format<D>::load(p[i]);
      a = v < a ? v : a;
      b = v > b ? v : b;
      bad += v * 0.0f;  // NaN exactly when some value is NaN or +-inf
    }
    bool any_bad = is_nan(bad);
    for (int s = 16; s > 0; s >>= 1) {
      float oa = __shfl_xor_sync(0xFFFFFFFFu, a, s), ob = __shfl_xor_sync(0xFFFFFFFFu, b, s);
      a = oa < a ? oa : a;
      b = ob > b ? ob : b;
    }
    any_bad = __any_sync(0xFFFFFFFFu, any_bad);
    if (lane == 0) {
      mn[t] = any_bad ? bits_float(0x7FC00000u) : a;
      mx[t] = any_bad ? bits_float(0x7FC00000u) : b;
    }
  }
}

// The 8 values of chunk k: one 16-byte load (16-bit formats) or two (fp32) when the chunk lies
// inside the sample and is aligned, else value by value (load_chunk). Padding reads as 0.
template <int D>
__device__ __forceinline__ int load_chunk_vec(const typename Format<D>::T* sample, int64_t per_sample, int64_t k,
                                              float v[8]) {
  using T = typename Format<D>::T;
  const T* src = sample + k * 8;
  if ((k + 1) * 8 <= per_sample && (reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
    if constexpr (D == kF32) {
      const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
      const uint4 w = reinterpret_cast<const uint4*>(src)[0];
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
      for (int j = 0; j < 8; ++j) v[j] = Format<D>::load(static_cast<T>(words[j >> 1] >> (16 * (j & 1))));
    }
    return 8;
  }
  return load_chunk<D>(sample, per_sample, k, v);
}

// One warp per group, one pass: each lane loads its 8-value chunks (vector loads), takes their
// range, the warp reduces it with shuffles (unless mn/mx were given), and the lanes quantize the
// same values -- kept in registers when a lane has one chunk (groups of up to 256 values), else
// reloaded from cache. Min, max and the non-finite flag are order-independent, so the codes
// equal the CPU's.
template <int D>
__global__ void quantize_kernel(const typename Format<D>::T* __restrict__ x, Groups gr, const float* __restrict__ mn,
                                const float* __restrict__ mx, SampleLayout layout, int64_t total_bytes, uint64_t seed,
                                uint64_t offset, uint8_t* __restrict__ codes, uint16_t* __restrict__ lo,
                                uint16_t* __restrict__ scale) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_threads() / 32, cps = gr.chunks_per_sample(), per_group = gr.group_size / 8;
  const bool in_registers = per_group <= 32;
  for (int64_t t = global_thread() / 32; t < gr.n * gr.g; t += warps) {
    const int64_t n = t / gr.g, gi = t % gr.g;
    const typename Format<D>::T* sample = x + n * gr.per_sample;
    float v[8];
    int valid = 0;
    if (in_registers && lane < per_group) valid = load_chunk_vec<D>(sample, gr.per_sample, gi * per_group + lane, v);
    float a, b;
    if (mn != nullptr) {
      a = mn[t];
      b = mx[t];
    } else {
      a = bits_float(0x7F800000u);
      b = bits_float(0xFF800000u);
      float bad = 0.0f;
      for (int64_t kk = lane; kk < per_group; kk += 32) {
        if (!in_registers) valid = load_chunk_vec<D>(sample, gr.per_sample, gi * per_group + kk, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // a fixed count, so v stays in registers
          if (j >= valid) break;
          a = v[j] < a ? v[j] : a;
          b = v[j] > b ? v[j] : b;
          bad += v[j] * 0.0f;  // NaN exactly when some value is NaN or +-inf
        }
      }
      bool any_bad = is_nan(bad);
      for (int s = 16; s > 0; s >>= 1) {
        float oa = __shfl_xor_sync(0xFFFFFFFFu, a, s), ob = __shfl_xor_sync(0xFFFFFFFFu, b, s);
        a = oa < a ? oa : a;
        b = ob > b ? ob : b;
      }
      any_bad = __any_sync(0xFFFFFFFFu, any_bad);
      if (any_bad) a = b = bits_float(0x7FC00000u);
    }
    const int bits = layout.bits_of(n);
    const GroupParams p = group_params(a, b, bits);
    if (lane == 0) {
      lo[t] = p.lo_bits;
      scale[t] = p.scale_bits;
    }
    for (int64_t kk = lane; kk < per_group; kk += 32) {
      const int64_t k = gi * per_group + kk;
      const int64_t at = layout.start_of(n, cps) + k * bits;
      if (at + bits > total_bytes) continue;  // per-sample bits inconsistent with total_bits: never write out of bounds
      if (!in_registers) valid = load_chunk_vec<D>(sample, gr.per_sample, k, v);
      quantize8(v, valid, p, bits, static_cast<uint64_t>(n * cps + k), seed, offset, codes + at);
    }
  }
}

// The 8 values v of a chunk written to dst (its first `valid`): one 16-byte store (16-bit formats) or
// two (fp32) when the chunk is whole and dst aligned, else value by value. The store side of
// load_chunk_vec.
template <int D>
__device__ __forceinline__ void store_chunk_vec(typename Format<D>::T* dst, int valid, const float v[8]) {
  if (valid == 8 && (reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
    if constexpr (D == kF32) {
      reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = static_cast<uint32_t>(Format<D>::store(v[2 * j])) |
               (static_cast<uint32_t>(Format<D>::store(v[2 * j + 1])) << 16);
      }
      reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    return;
  }
  for (int j = 0; j < valid; ++j) dst[j] = Format<D>::store(v[j]);
}

// One thread per 8-value chunk of a sample: its `bits` code bytes read once (unpack8), its group's
// lo and scale once, its values written by store_chunk_vec. A value per thread, as before, took two
// integer divisions and a layout lookup per value, and a 4-byte store each: 22 % of a copy's rate on
// an H200 (docs/design.md §11). I: the index type (int32_t when the values' indices fit).
template <int D, typename I>
__global__ void dequantize_kernel(const uint8_t* __restrict__ codes, const uint16_t* __restrict__ lo,
                                  const uint16_t* __restrict__ scale, Groups gr, SampleLayout layout,
                                  int64_t total_bytes, typename Format<D>::T* __restrict__ out) {
  const I per_sample = static_cast<I>(gr.per_sample), chunks = static_cast<I>((gr.per_sample + 7) / 8);
  const I per_group = static_cast<I>(gr.group_size / 8), g = static_cast<I>(gr.g);
  const I total = static_cast<I>(gr.n) * chunks;
  const int64_t cps = gr.chunks_per_sample();
  for (I c = static_cast<I>(global_thread()); c < total; c += static_cast<I>(grid_threads())) {
    const I n = c / chunks, k = c - n * chunks;
    const int bits = layout.bits_of(n);
    const int64_t at = layout.start_of(n, cps) + static_cast<int64_t>(k) * bits;
    if (at + bits > total_bytes) continue;
    const I t = n * g + k / per_group;
    const float l = bf16_to_float(lo[t]), s = bf16_to_float(scale[t]);
    uint32_t q[8];
    unpack8(codes + at, bits, q);
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = dequantize_code(q[j], l, s);
    const I first = k * 8;
    store_chunk_vec<D>(out + static_cast<int64_t>(n) * per_sample + first,
                       per_sample - first >= 8 ? 8 : static_cast<int>(per_sample - first), v);
  }
}

// One thread per value; a warp's 32 bits (a ballot, lane l -> bit l, LSB first) are written by its
// first four lanes, one byte each.
template <int D>
__global__ void pack_mask_kernel(const void* __restrict__ mask, int64_t numel, uint8_t* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t nbytes = (numel + 7) / 8;
  // Whole warps iterate together, so the ballot always sees all 32 lanes.
  for (int64_t base = global_thread() - lane; base < numel; base += grid_threads()) {
    const int64_t idx = base + lane;
    uint32_t bit = 0;
    if (idx < numel) {
      if constexpr (D < 0) {
        bit = static_cast<const bool*>(mask)[idx] ? 1u : 0u;
      } else {
        bit = mask_bit(Format<D>::load(static_cast<const typename Format<D>::T*>(mask)[idx]));
      }
    }
    const uint32_t word = __ballot_sync(0xFFFFFFFFu, bit != 0);
    const int64_t byte = base / 8 + lane;
    if (lane < 4 && byte < nbytes) out[byte] = static_cast<uint8_t>(word >> (8 * lane));
  }
}

// One thread per value: bit i % 8 of byte i / 8.
template <typename I>
__global__ void unpack_mask_kernel(const uint8_t* __restrict__ packed, I numel, bool* __restrict__ out) {
  for (I i = static_cast<I>(global_thread()); i < numel; i += static_cast<I>(grid_threads())) {
    out[i] = (packed[i >> 3] >> (i & 7)) & 1u;
  }
}

// One thread per mask byte: its 8 gradient values loaded together (load_chunk_vec), masked (and
// scaled) by the byte's bits, stored together (store_chunk_vec). A value per thread, as before,
// kept one 4-byte load in flight per thread: 33 % of a copy's rate on an H200 (docs/design.md §11).
template <int D, typename I>
__global__ void apply_mask_kernel(const typename Format<D>::T* __restrict__ grad, const uint8_t* __restrict__ packed,
                                  I numel, float s, typename Format<D>::T* __restrict__ out) {
  const I bytes = numel / 8 + (numel % 8 != 0);
  for (I b = static_cast<I>(global_thread()); b < bytes; b += static_cast<I>(grid_threads())) {
    const uint32_t byte = packed[b];
    float v[8];
    const int valid = load_chunk_vec<D>(grad, numel, b, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = masked_value(v[j], (byte >> j) & 1u, s);
    store_chunk_vec<D>(out + static_cast<int64_t>(b) * 8, valid, v);
  }
}

// One thread per output value.
template <int D, typename I>
__global__ void max_pool2d_kernel(const typename Format<D>::T* __restrict__ x, int64_t planes, Pool2d p,
                                  typename Format<D>::T* __restrict__ out, int8_t* __restrict__ argmax) {
  const I out_w = static_cast<I>(p.out_w), out_plane = static_cast<I>(p.out_h * p.out_w);
  const I in_plane = static_cast<I>(p.in_h * p.in_w), total = static_cast<I>(planes) * out_plane;
  for (I i = static_cast<I>(global_thread()); i < total; i += static_cast<I>(grid_threads())) {
    const I c = i / out_plane, r = i - c * out_plane;
    const I oh = r / out_w, ow = r - oh * out_w;
    float best;
    argmax[i] = window_inside(p, oh, ow) ? window_argmax_inside<Format<D>>(x + c * in_plane, p, oh, ow, &best)
                                         : window_argmax<Format<D>>(x + c * in_plane, p, oh, ow, &best);
    out[i] = Format<D>::store(best);
  }
}

// One thread per input-gradient value: a gather over the windows that can hold it (pool_input_grad).
template <int D, typename I>
__global__ void max_pool2d_backward_kernel(const typename Format<D>::T* __restrict__ grad, const int8_t* __restrict__ arg,
                                           int64_t planes, Pool2d p, typename Format<D>::T* __restrict__ gin) {
  const I in_w = static_cast<I>(p.in_w), in_plane = static_cast<I>(p.in_h * p.in_w);
  const I out_plane = static_cast<I>(p.out_h * p.out_w), total = static_cast<I>(planes) * in_plane;
  for (I i = static_cast<I>(global_thread()); i < total; i += static_cast<I>(grid_threads())) {
    const I c = i / in_plane, r = i - c * in_plane;
    const I h = r / in_w, w = r - h * in_w;
    gin[i] = Format<D>::store(pool_input_grad<Format<D>, typename Format<D>::T, I>(grad + c * out_plane,
                                                                                 arg + c * out_plane, p, h, w));
  }
}

// Whether every index of a kernel over `work` values (plus a grid's worth of overshoot in the
// grid-stride loop) fits in int32_t.
inline bool fits_int32(int64_t work) { return work + kMaxBlocks * kThreads < (int64_t{1} << 31); }

// Runs `launch.template operator()<D>()` for the runtime dtype code; unknown codes fail loudly.
template <typename F>
cudaError_t by_dtype(int dtype, F&& launch) {
  switch (dtype) {
    case kF32: launch.template operator()<kF32>(); break;
    case kF16: launch.template operator()<kF16>(); break;
    case kBF16: launch.template operator()<kBF16>(); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_group_minmax(int dtype, const void* x, Groups gr, float* mn, float* mx, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    group_minmax_kernel<D><<<blocks_for(gr.n * gr.g * 32), kThreads, 0, stream>>>(static_cast<const T*>(x), gr, mn, mx);
  });
}

cudaError_t launch_quantize(int dtype, const void* x, Groups gr, const float* mn, const float* mx,
                            SampleLayout layout, int64_t total_bytes, uint64_t seed, uint64_t offset,
                            uint8_t* codes, uint16_t* lo, uint16_t* scale, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    quantize_kernel<D><<<blocks_for(gr.n * gr.g * 32), kThreads, 0, stream>>>(
        static_cast<const T*>(x), gr, mn, mx, layout, total_bytes, seed, offset, codes, lo, scale);
  });
}

cudaError_t launch_dequantize(int dtype, const uint8_t* codes, const uint16_t* lo, const uint16_t* scale, Groups gr,
                              SampleLayout layout, int64_t total_bytes, void* out, cudaStream_t stream) {
  const int64_t values = gr.n * gr.per_sample, chunks = gr.n * ((gr.per_sample + 7) / 8);
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    if (fits_int32(values)) {
      dequantize_kernel<D, int32_t><<<blocks_for(chunks), kThreads, 0, stream>>>(codes, lo, scale, gr, layout,
                                                                                total_bytes, static_cast<T*>(out));
    } else {
      dequantize_kernel<D, int64_t><<<blocks_for(chunks), kThreads, 0, stream>>>(codes, lo, scale, gr, layout,
                                                                                total_bytes, static_cast<T*>(out));
    }
  });
}

cudaError_t launch_pack_mask(int code, const void* mask, int64_t numel, uint8_t* out, cudaStream_t stream) {
  const unsigned blocks = blocks_for(numel);
  switch (code) {
    case -1: pack_mask_kernel<-1><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    case kF32: pack_mask_kernel<kF32><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    case kF16: pack_mask_kernel<kF16><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    case kBF16: pack_mask_kernel<kBF16><<<blocks, kThreads, 0, stream>>>(mask, numel, out); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_unpack_mask(const uint8_t* packed, int64_t numel, bool* out, cudaStream_t stream) {
  if (fits_int32(numel)) {
    unpack_mask_kernel<int32_t><<<blocks_for(numel), kThreads, 0, stream>>>(packed, static_cast<int32_t>(numel), out);
  } else {
    unpack_mask_kernel<int64_t><<<blocks_for(numel), kThreads, 0, stream>>>(packed, numel, out);
  }
  return cudaGetLastError();
}

cudaError_t launch_apply_mask(int dtype, const void* grad, const uint8_t* packed, int64_t numel, float scale,
                              void* out, cudaStream_t stream) {
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    const unsigned blocks = blocks_for((numel + 7) / 8);
    if (fits_int32(numel)) {
      apply_mask_kernel<D, int32_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<const T*>(grad), packed, static_cast<int32_t>(numel), scale, static_cast<T*>(out));
    } else {
      apply_mask_kernel<D, int64_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<const T*>(grad), packed, numel, scale, static_cast<T*>(out));
    }
  });
}

cudaError_t launch_max_pool2d(int dtype, const void* x, int64_t planes, Pool2d p, void* out, int8_t* argmax,
                              cudaStream_t stream) {
  const int64_t work = planes * p.out_h * p.out_w;
  const bool narrow = fits_int32(work) && fits_int32(planes * p.in_h * p.in_w);
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    if (narrow) {
      max_pool2d_kernel<D, int32_t><<<blocks_for(work), kThreads, 0, stream>>>(static_cast<const T*>(x), planes, p,
                                                                              static_cast<T*>(out), argmax);
    } else {
      max_pool2d_kernel<D, int64_t><<<blocks_for(work), kThreads, 0, stream>>>(static_cast<const T*>(x), planes, p,
                                                                              static_cast<T*>(out), argmax);
    }
  });
}

cudaError_t launch_max_pool2d_backward(int dtype, const void* grad_out, const int8_t* argmax, int64_t planes,
                                       Pool2d p, void* grad_in, cudaStream_t stream) {
  const int64_t work = planes * p.in_h * p.in_w;
  const bool narrow = fits_int32(work) && fits_int32(planes * p.out_h * p.out_w);
  return by_dtype(dtype, [&]<int D>() {
    using T = typename Format<D>::T;
    if (narrow) {
      max_pool2d_backward_kernel<D, int32_t><<<blocks_for(work), kThreads, 0, stream>>>(
          static_cast<const T*>(grad_out), argmax, planes, p, static_cast<T*>(grad_in));
    } else {
      max_pool2d_backward_kernel<D, int64_t><<<blocks_for(work), kThreads, 0, stream>>>(
          static_cast<const T*>(grad_out), argmax, planes, p, static_cast<T*>(grad_in));
    }
  });
}

}  // namespace actbench
